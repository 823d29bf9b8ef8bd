"""Workloads: the model, this rank's training batches and the evaluation, per data set.

``build_task(cfg, rank, world_size)`` returns an ``ImageTask`` (digits, CIFAR-10/100,
synthetic images; top-1/top-5 accuracy) or a ``LanguageTask`` (PTB, synthetic text;
perplexity). Both expose the same small surface, so the training loop does not care:

    task.model, task.metric, task.steps_per_epoch, task.device
    task.to(device)                     -> the model and every batch from now on on device
    task.batches(epoch, start_batch)    -> iterator of (inputs, targets) for this rank
    task.loss(batch)                    -> training loss (LM: carries the hidden state)
    task.evaluate(max_batches, comm)    -> {"loss": ..., "top1"/"perplexity": ...}; collective
    task.state_dict() / load_state_dict(state)
    task.reshard(rank, world_size, batch_in_epoch, from_world_size) -> the batch to go on from
"""
from __future__ import annotations

import math
import os

import torch
import torch.nn.functional as F

from .. import data as D
from .config import Config, ConfigError
from .device import to_device
from ..models import IMAGE_MODELS, build_model, detach_hidden
from ..util.choices import did_you_mean

DATA_OPTIONS = {
    "digits": {"test_fraction": 0.2},
    "cifar10": {},
    "cifar100": {},
    "synthetic_images": {"num_train": 2048, "num_test": 512, "num_classes": 10,
                         "image_size": 32, "noise_std": 40.0, "label_noise": 0.0},
    "ptb": {},
    "synthetic_text": {"num_tokens": 200_000, "valid_tokens": 20_000, "vocab_size": 1000,
                       "branching": 4, "zipf": 0.0},
}


def data_options(cfg: Config) -> dict:
    """``data.options`` over the data set's defaults; unknown options are config errors."""
    defaults = DATA_OPTIONS[cfg.data.name]
    unknown = sorted(set(cfg.data.options) - set(defaults))
    if unknown:
        raise ConfigError(f"data.options={cfg.data.options!r}: unknown option(s) {unknown} for "
                          f"{cfg.data.name}; allowed: {', '.join(defaults) or 'none'}"
                          f"{did_you_mean(unknown[0], defaults)}")
    return {**defaults, **cfg.data.options}


def _model(cfg: Config, **defaults):
    options = {**defaults, **cfg.model.options}
    try:
        return build_model(cfg.model.name, **options)
    except ValueError as exc:
        raise ConfigError(f"model.options={cfg.model.options!r}: {exc}") from None


def _flip_labels(labels: torch.Tensor, fraction: float, num_classes: int,
                 seed: int) -> torch.Tensor:
    """Replace ``fraction`` of the labels by uniform random classes (an irreducible loss
    floor, as real data has; the test labels stay clean)."""
    if not 0.0 <= fraction <= 1.0:
        raise ConfigError(f"data.options.label_noise={fraction!r}: must be in [0, 1]")
    if fraction == 0.0:
        return labels
    g = torch.Generator().manual_seed(seed + 7919)
    flip = torch.rand(len(labels), generator=g) < fraction
    noisy = labels.clone()
    noisy[flip] = torch.randint(0, num_classes, (int(flip.sum()),), generator=g)
    return noisy


def _allreduce_sums(values: list[float], comm, name: str) -> list[float]:
    total = comm.allreduce(torch.tensor(values, dtype=torch.float64), op="sum", name=name)
    return total.tolist()


class ImageTask:
    """Image classification on in-memory tensors, each rank on its own shard."""

    metric = "top1"

    def __init__(self, cfg: Config, rank: int, world_size: int):
        self.cfg, self.rank, self.world_size = cfg, rank, world_size
        opts = data_options(cfg)
        name, seed = cfg.data.name, cfg.run.seed
        self.train_transform = self.eval_transform = None
        if name == "digits":
            self.train_x, self.train_y = D.load_digits_dataset(True, opts["test_fraction"], seed)
            self.test_x, self.test_y = D.load_digits_dataset(False, opts["test_fraction"], seed)
            num_classes, channels, size = 10, 1, 8
        elif name in ("cifar10", "cifar100"):
            try:
                self.train_x, self.train_y = D.load_cifar(cfg.data.root, name, train=True)
                self.test_x, self.test_y = D.load_cifar(cfg.data.root, name, train=False)
            except (FileNotFoundError, D.DataFileError) as exc:
                raise ConfigError(f"data.root={cfg.data.root!r}: {exc}") from None
            num_classes, channels, size = (10 if name == "cifar10" else 100), 3, 32
            # Each rank augments with its own generator: different crops per rank.
            train_tf, self.eval_transform = D.cifar_transforms(name, seed=seed * 1009 + rank)
            self.train_transform = train_tf if cfg.data.augment else self.eval_transform
        else:  # synthetic_images
            n_train, n_test = opts["num_train"], opts["num_test"]
            num_classes, channels, size = opts["num_classes"], 3, opts["image_size"]
            x, y = D.synthetic_images(n_train + n_test, num_classes, size, 3, seed=seed,
                                      noise_std=opts["noise_std"])
            self.train_x, self.train_y = x[:n_train], _flip_labels(
                y[:n_train], opts["label_noise"], num_classes, seed)
            self.test_x, self.test_y = x[n_train:], y[n_train:]
            augment = D.CifarAugment(seed=seed * 1009 + rank)
            self.eval_transform = D.Normalize()
            self.train_transform = augment if cfg.data.augment else self.eval_transform
        if len(self.test_y) == 0:     # every evaluation would report 0 accuracy
            raise ConfigError(_empty_test_set(cfg))
        self.num_classes = num_classes
        defaults = {"num_classes": num_classes}
        if cfg.model.name in ("small_cnn", "wide_head_cnn"):
            defaults.update(in_channels=channels, image_size=size)
        elif cfg.model.name in IMAGE_MODELS:
            defaults.update(in_channels=channels)
        self.model = _model(cfg, **defaults)
        self.device = torch.device("cpu")
        self.batch_size = cfg.data.batch_size
        self._shard(rank, world_size)

    def to(self, device: torch.device) -> "ImageTask":
        """Train and evaluate on ``device``: the data stay in host memory (augmented there,
        as a data loader would) and each batch is copied over."""
        self.model.to(device)
        self.device = device
        return self

    def _shard(self, rank: int, world_size: int) -> None:
        self.rank, self.world_size = rank, world_size
        self.sampler = D.ShardedSampler(len(self.train_y), rank, world_size, shuffle=True,
                                        seed=self.cfg.run.seed)
        self.steps_per_epoch = self.steps_for(world_size)
        if self.steps_per_epoch < 1:
            raise ConfigError(f"data.batch_size={self.batch_size}: larger than this rank's shard "
                              f"of {self.sampler.shard_size} training samples")

    def steps_for(self, world_size: int) -> int:
        """Steps per epoch with ``world_size`` ranks."""
        return (len(self.train_y) // world_size) // self.batch_size

    def reshard(self, rank: int, world_size: int, batch_in_epoch: int,
                from_world_size: int) -> int:
        """Deal the data to ``world_size`` ranks (an elastic reset) and return the batch of
        the current epoch to go on from, given ``batch_in_epoch`` batches done by
        ``from_world_size`` ranks. Ranks deal one shared permutation round-robin, so those
        batches consumed exactly its first ``batch_in_epoch * batch * from_world_size``
        positions; the new position rounds that down (a few samples are seen twice)."""
        consumed = batch_in_epoch * self.batch_size * from_world_size
        self._shard(rank, world_size)
        return min(consumed // (self.batch_size * world_size), self.steps_per_epoch)

    def batches(self, epoch: int, start_batch: int = 0):
        self.sampler.set_epoch(epoch)
        self.sampler.set_start(start_batch * self.batch_size)
        batches = D.TensorBatches(self.train_x, self.train_y, self.batch_size, self.sampler,
                                  transform=self.train_transform, drop_last=True)
        return (to_device(batch, self.device) for batch in batches)

    def loss(self, batch) -> torch.Tensor:
        x, y = batch
        return F.cross_entropy(self.model(x), y)

    @torch.no_grad()
    def evaluate(self, max_batches: int | None, comm) -> dict:
        """Top-1/top-5 accuracy and loss over the test set, sharded across ranks; the sums
        travel over ``comm`` (a ``gravac.comm.Comm``)."""
        was_training = self.model.training
        self.model.eval()
        # A test set smaller than the number of ranks leaves some ranks none: they add
        # zeros to the sums, and the metric is over the samples that exist.
        idx = torch.arange(len(self.test_y))[self.rank::self.world_size]
        bs = self.cfg.data.eval_batch_size
        correct1 = correct5 = loss_sum = count = 0.0
        for b, start in enumerate(range(0, len(idx), bs)):
            if max_batches is not None and b >= max_batches:
                break
            sel = idx[start:start + bs]
            x, y = self.test_x[sel], self.test_y[sel]
            if self.eval_transform is not None:
                x = self.eval_transform(x)
            x, y = to_device((x, y), self.device)
            logits = self.model(x)
            loss_sum += float(F.cross_entropy(logits, y, reduction="sum"))
            top = logits.topk(min(5, self.num_classes), dim=1).indices
            correct1 += float((top[:, 0] == y).sum())
            correct5 += float((top == y[:, None]).any(1).sum())
            count += len(y)
        self.model.train(was_training)
        correct1, correct5, loss_sum, count = _allreduce_sums(
            [correct1, correct5, loss_sum, count], comm, "gravac.eval.image")
        count = max(count, 1.0)
        return {"loss": loss_sum / count, "top1": correct1 / count, "top5": correct5 / count}

    def state_dict(self) -> dict:
        tf = self.train_transform
        return {"augment": tf.state_dict() if hasattr(tf, "state_dict") else None}

    def load_state_dict(self, state: dict) -> None:
        tf = self.train_transform
        if state.get("augment") is not None and hasattr(tf, "load_state_dict"):
            tf.load_state_dict(state["augment"])


def _empty_test_set(cfg: Config) -> str:
    """The one line refusing an image data set without test samples."""
    if cfg.data.name == "synthetic_images":
        return (f"data.options.num_test={data_options(cfg)['num_test']!r}: the evaluation set "
                "is empty, so there is nothing to measure the model on; set it >= 1")
    return (f"data.root={cfg.data.root!r}: the {cfg.data.name} test set holds no images; "
            "use the full test file")


def _check_ptb_sizes(cfg: Config, train, valid, world_size: int) -> None:
    """PTB files too short for one batch per rank: say which file and how much it needs
    (batchify would fail with a traceback, or the run would have no step)."""
    d = cfg.data
    checks = ((D.PTB_FILES[0], len(train), world_size * d.batch_size * 2,
               f"one training batch (data.batch_size={d.batch_size} per rank x {world_size} "
               "ranks x 2 rows)", "data.batch_size"),
              # 2 rows: inputs and their next words (1 row evaluates nothing: perplexity 1)
              (D.PTB_FILES[1], len(valid), world_size * d.eval_batch_size * 2,
               f"one evaluation batch (data.eval_batch_size={d.eval_batch_size} per rank x "
               f"{world_size} ranks x 2 rows)", "data.eval_batch_size"))
    for name, have, need, what, knob in checks:
        if have < need:
            path = os.path.join(os.fspath(d.root), name)
            raise ConfigError(f"data.root={d.root!r}: {path}: {have} tokens, fewer than "
                              f"{what} needs ({need}); use the full file, or a smaller {knob}")


class LanguageTask:
    """Word-level language modelling with truncated BPTT; each rank on its own text."""

    metric = "perplexity"

    def __init__(self, cfg: Config, rank: int, world_size: int):
        self.cfg, self.rank, self.world_size = cfg, rank, world_size
        opts = data_options(cfg)
        if cfg.data.name == "ptb":
            try:
                corpus = D.load_ptb(cfg.data.root)
            except (FileNotFoundError, D.DataFileError) as exc:
                raise ConfigError(f"data.root={cfg.data.root!r}: {exc}") from None
            train, valid, vocab = corpus.train, corpus.valid, len(corpus.dictionary)
            _check_ptb_sizes(cfg, train, valid, world_size)
        else:
            vocab = opts["vocab_size"]
            tokens = D.synthetic_text(opts["num_tokens"] + opts["valid_tokens"], vocab,
                                      seed=cfg.run.seed, branching=opts["branching"],
                                      zipf=opts["zipf"])
            train, valid = tokens[:opts["num_tokens"]], tokens[opts["num_tokens"]:]
        self.vocab_size = vocab
        self.model = _model(cfg, vocab_size=vocab)
        self.device = torch.device("cpu")
        self.bptt = cfg.data.bptt
        self.batch_size = cfg.data.batch_size
        self._train_tokens, self._valid_tokens = train, valid
        self._shard(rank, world_size)

    def _shard(self, rank: int, world_size: int) -> None:
        self.rank, self.world_size = rank, world_size
        self.train_data = D.batchify(D.shard_tokens(self._train_tokens, rank, world_size),
                                     self.batch_size)
        self.valid_data = D.batchify(D.shard_tokens(self._valid_tokens, rank, world_size),
                                     self.cfg.data.eval_batch_size)
        self.steps_per_epoch = self.steps_for(world_size)
        if self.steps_per_epoch < 1:
            raise ConfigError(f"data.batch_size={self.batch_size}: too large for this rank's "
                              f"share of {len(self._train_tokens)} training tokens")
        self.hidden = None

    def to(self, device: torch.device) -> "LanguageTask":
        """Train and evaluate on ``device``; each batch of token ids is copied over."""
        self.model.to(device)
        self.device = device
        if self.hidden is not None:
            self.hidden = tuple(h.to(device) for h in self.hidden)
        return self

    def steps_for(self, world_size: int) -> int:
        """Steps per epoch with ``world_size`` ranks (as ``shard_tokens`` + ``batchify`` cut)."""
        rows = (len(self._train_tokens) // world_size) // self.batch_size
        return math.ceil(max(rows - 1, 0) / self.bptt)

    def reshard(self, rank: int, world_size: int, batch_in_epoch: int,
                from_world_size: int) -> int:
        """Cut the text for ``world_size`` ranks (an elastic reset) and return the batch of
        the current epoch to go on from: the fraction of the epoch that ``batch_in_epoch``
        batches of ``from_world_size`` ranks covered (each rank reads its own contiguous
        part, so no exact mapping exists). The hidden state restarts at zero."""
        done = batch_in_epoch / max(self.steps_for(from_world_size), 1)
        self._shard(rank, world_size)
        return min(int(done * self.steps_per_epoch), self.steps_per_epoch)

    def batches(self, epoch: int, start_batch: int = 0):
        if start_batch == 0:
            self.hidden = None   # a new pass over the text starts from a zero state
        for i in range(start_batch * self.bptt, self.train_data.size(0) - 1, self.bptt):
            yield to_device(D.get_bptt_batch(self.train_data, i, self.bptt), self.device)

    def loss(self, batch) -> torch.Tensor:
        inputs, targets = batch
        hidden = None if self.hidden is None else detach_hidden(self.hidden)
        logits, self.hidden = self.model(inputs, hidden)
        return F.cross_entropy(logits, targets)

    @torch.no_grad()
    def evaluate(self, max_batches: int | None, comm) -> dict:
        """Perplexity over the validation text, sharded across ranks."""
        was_training = self.model.training
        self.model.eval()
        hidden, loss_sum, count = None, 0.0, 0.0
        for b, i in enumerate(range(0, self.valid_data.size(0) - 1, self.bptt)):
            if max_batches is not None and b >= max_batches:
                break
            inputs, targets = to_device(D.get_bptt_batch(self.valid_data, i, self.bptt),
                                        self.device)
            logits, hidden = self.model(inputs, hidden)
            loss_sum += float(F.cross_entropy(logits, targets, reduction="sum"))
            count += targets.numel()
        self.model.train(was_training)
        loss_sum, count = _allreduce_sums([loss_sum, count], comm, "gravac.eval.lm")
        loss = loss_sum / max(count, 1.0)
        return {"loss": loss, "perplexity": math.exp(min(loss, 50.0))}

    def state_dict(self) -> dict:
        return {"hidden": None if self.hidden is None else tuple(h.clone() for h in self.hidden)}

    def load_state_dict(self, state: dict) -> None:
        hidden = state.get("hidden")
        # A checkpoint loads into host memory (map_location="cpu"): back onto the model's device.
        self.hidden = None if hidden is None else tuple(h.to(self.device) for h in hidden)


def build_task(cfg: Config, rank: int, world_size: int):
    if cfg.data.name in ("ptb", "synthetic_text"):
        return LanguageTask(cfg, rank, world_size)
    return ImageTask(cfg, rank, world_size)
