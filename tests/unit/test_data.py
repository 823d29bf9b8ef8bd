"""gravac.data: CIFAR/PTB readers on tiny files, sharding, augmentation, digits, synthetic."""
import os
import pickle

import numpy as np
import pytest
import torch

from gravac.data import (CIFAR10_MEAN, CIFAR10_STD, CifarAugment, Normalize,
                               ShardedSampler, TensorBatches, batchify, cifar_transforms,
                               get_bptt_batch, load_cifar, load_digits_dataset, load_ptb,
                               shard_tokens, synthetic_images, synthetic_text)

# ------------------------------------------------------------------------------ CIFAR


def write_batch(path, data, labels, label_key):
    entry = {b"batch_label": b"test", label_key: list(labels), b"data": data,
             b"filenames": [b"img%d.png" % i for i in range(len(labels))]}
    if label_key == b"fine_labels":
        entry[b"coarse_labels"] = [lab // 5 for lab in labels]
    with open(path, "wb") as f:
        pickle.dump(entry, f, protocol=2)  # the official files are Python 2 pickles


def make_cifar10(root, n=10):
    folder = root / "cifar-10-batches-py"
    folder.mkdir()
    rng = np.random.default_rng(0)
    written = {}
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        data = rng.integers(0, 256, size=(n, 3072), dtype=np.uint8)
        labels = rng.integers(0, 10, size=n).tolist()
        write_batch(folder / name, data, labels, b"labels")
        written[name] = (data, labels)
    return written


def test_cifar10_train_and_test(tmp_path):
    written = make_cifar10(tmp_path)
    images, labels = load_cifar(tmp_path, "cifar10", train=True)
    assert images.shape == (50, 3, 32, 32) and images.dtype == torch.uint8
    assert labels.shape == (50,) and labels.dtype == torch.int64
    expect = np.concatenate([written[f"data_batch_{i}"][0] for i in range(1, 6)])
    # Row layout: 1024 red, then green, then blue; each plane row-major 32x32.
    i, c, r, col = 13, 1, 5, 30
    assert images[i, c, r, col].item() == expect[i, c * 1024 + r * 32 + col]
    assert torch.equal(images.reshape(50, -1), torch.from_numpy(expect))
    assert labels.tolist() == sum((written[f"data_batch_{i}"][1] for i in range(1, 6)), [])
    test_images, test_labels = load_cifar(tmp_path, "cifar10", train=False)
    assert test_images.shape == (10, 3, 32, 32)
    assert test_labels.tolist() == written["test_batch"][1]


def test_cifar_red_plane_first(tmp_path):
    folder = tmp_path / "cifar-10-batches-py"
    folder.mkdir()
    data = np.concatenate([np.full((2, 1024), v, np.uint8) for v in (200, 100, 50)], axis=1)
    data[0, 32 * 3 + 7] = 9  # red plane, row 3, column 7
    write_batch(folder / "test_batch", data, [3, 4], b"labels")
    images, labels = load_cifar(folder, "cifar10", train=False)  # root = the folder itself
    assert images[:, 0].float().mean() < 200 and images[1, 0].unique().tolist() == [200]
    assert images[:, 1].unique().tolist() == [100] and images[:, 2].unique().tolist() == [50]
    assert images[0, 0, 3, 7].item() == 9
    assert labels.tolist() == [3, 4]


def test_cifar100_fine_labels(tmp_path):
    folder = tmp_path / "cifar-100-python"
    folder.mkdir()
    rng = np.random.default_rng(1)
    for name, n in (("train", 10), ("test", 4)):
        write_batch(folder / name, rng.integers(0, 256, (n, 3072), dtype=np.uint8),
                    rng.integers(0, 100, n).tolist(), b"fine_labels")
    images, labels = load_cifar(tmp_path, "cifar100", train=True)
    assert images.shape == (10, 3, 32, 32) and labels.dtype == torch.int64
    assert labels.max() < 100
    with open(folder / "test", "rb") as f:
        fine = pickle.load(f, encoding="bytes")[b"fine_labels"]
    assert load_cifar(tmp_path, "cifar100", train=False)[1].tolist() == fine


def test_cifar_missing_folder_names_path_and_download(tmp_path):
    with pytest.raises(FileNotFoundError) as err:
        load_cifar(tmp_path, "cifar10")
    msg = str(err.value)
    assert os.path.join(str(tmp_path), "cifar-10-batches-py") in msg
    assert "cifar-10-python.tar.gz" in msg and "torchvision" in msg
    with pytest.raises(FileNotFoundError, match="cifar-100-python"):
        load_cifar(tmp_path, "cifar100")


def test_cifar_missing_file_is_named(tmp_path):
    make_cifar10(tmp_path)
    os.remove(tmp_path / "cifar-10-batches-py" / "data_batch_3")
    with pytest.raises(FileNotFoundError, match="data_batch_3"):
        load_cifar(tmp_path, "cifar10", train=True)
    assert load_cifar(tmp_path, "cifar10", train=False)[0].shape[0] == 10


def test_cifar_unknown_dataset(tmp_path):
    with pytest.raises(ValueError, match="cifar10, cifar100"):
        load_cifar(tmp_path, "mnist")


# ------------------------------------------------------------------------------ transforms


def uint8_batch(n=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (n, 3, 32, 32), generator=g, dtype=torch.uint8)


def test_normalize_values():
    images = torch.zeros(1, 3, 32, 32, dtype=torch.uint8)
    images[0, 0] = 255
    out = Normalize(CIFAR10_MEAN, CIFAR10_STD)(images)
    assert out.dtype == torch.float32
    assert torch.allclose(out[0, 0], torch.tensor((1 - CIFAR10_MEAN[0]) / CIFAR10_STD[0]))
    assert torch.allclose(out[0, 2], torch.tensor(-CIFAR10_MEAN[2] / CIFAR10_STD[2]))


def test_augment_shape_determinism_and_global_rng():
    images = uint8_batch()
    before = torch.get_rng_state()
    a = CifarAugment(seed=3)(images)
    b = CifarAugment(seed=3)(images)
    c = CifarAugment(seed=4)(images)
    assert torch.equal(torch.get_rng_state(), before)
    assert a.shape == images.shape and a.dtype == torch.float32
    assert torch.equal(a, b) and not torch.equal(a, c)
    gen = torch.Generator().manual_seed(3)
    assert torch.equal(CifarAugment(generator=gen)(images), a)


def test_augment_crop_is_a_window_of_the_padded_image():
    images = uint8_batch(6)
    out = CifarAugment(flip=False, seed=1)(images)
    padded = Normalize()(torch.nn.functional.pad(images, (4, 4, 4, 4)))
    shifted = 0
    for i in range(len(images)):
        matches = [(dy, dx) for dy in range(9) for dx in range(9)
                   if torch.allclose(out[i], padded[i, :, dy:dy + 32, dx:dx + 32])]
        assert len(matches) == 1
        shifted += matches[0] != (4, 4)
    assert shifted > 0


def test_augment_flip_only():
    images = uint8_batch(64)
    out = CifarAugment(padding=0, seed=2)(images)
    norm = Normalize()(images)
    same = [torch.equal(out[i], norm[i]) for i in range(64)]
    flipped = [torch.equal(out[i], norm[i].flip(-1)) for i in range(64)]
    assert all(s or f for s, f in zip(same, flipped))
    assert 10 < sum(flipped) < 54
    assert torch.equal(CifarAugment(padding=0, flip=False)(images), norm)


def test_augment_state_dict_resumes():
    images = uint8_batch()
    aug = CifarAugment(seed=5)
    aug(images)
    state = aug.state_dict()
    expect = aug(images)
    other = CifarAugment(seed=99)
    other.load_state_dict(state)
    assert torch.equal(other(images), expect)


def test_cifar_transforms_pair():
    train_tf, eval_tf = cifar_transforms("cifar100", seed=0)
    assert isinstance(train_tf, CifarAugment) and isinstance(eval_tf, Normalize)
    with pytest.raises(ValueError):
        cifar_transforms("svhn")


# ------------------------------------------------------------------------------ PTB


def write_ptb(root, train=" a b c \n b c d \n", valid=" a d \n", test=" c x \n"):
    for name, text in (("ptb.train.txt", train), ("ptb.valid.txt", valid),
                       ("ptb.test.txt", test)):
        (root / name).write_text(text)


def test_ptb_vocab_and_eos(tmp_path):
    write_ptb(tmp_path)
    corpus = load_ptb(tmp_path)
    d = corpus.dictionary
    assert d.idx2word[:5] == ["a", "b", "c", "<eos>", "d"]
    assert d.word2idx["<eos>"] == 3
    assert corpus.train.tolist() == [0, 1, 2, 3, 1, 2, 4, 3]
    assert corpus.valid.tolist() == [0, 4, 3]
    # "x" is not in the training vocabulary: it becomes <unk>.
    assert corpus.test.tolist() == [2, d.word2idx["<unk>"], 3]
    assert corpus.train.dtype == torch.int64


def test_ptb_missing_files_say_where(tmp_path):
    (tmp_path / "ptb.train.txt").write_text(" a \n")
    with pytest.raises(FileNotFoundError) as err:
        load_ptb(tmp_path)
    msg = str(err.value)
    assert "ptb.valid.txt" in msg and "ptb.test.txt" in msg and str(tmp_path) in msg
    assert "simple-examples" in msg


def test_batchify_columns_are_contiguous():
    out = batchify(torch.arange(10), 3)
    assert out.tolist() == [[0, 3, 6], [1, 4, 7], [2, 5, 8]]
    with pytest.raises(ValueError, match="fewer than batch_size"):
        batchify(torch.arange(2), 3)


def test_bptt_target_is_input_shifted_by_one():
    source = batchify(torch.arange(26), 2)  # [13, 2]
    x, y = get_bptt_batch(source, 0, bptt=5)
    assert x.shape == (5, 2) and y.shape == (10,)
    assert torch.equal(y.view(5, 2)[:-1], x[1:])
    assert torch.equal(y.view(5, 2), x + 1)  # arange: the next token is token + 1
    x, y = get_bptt_batch(source, 10, bptt=5)  # last window is shorter
    assert x.shape == (2, 2) and torch.equal(y.view(2, 2), source[11:13])
    with pytest.raises(ValueError):
        get_bptt_batch(source, 12)


def test_shard_tokens_contiguous_equal_disjoint():
    tokens = torch.arange(103)
    shards = [shard_tokens(tokens, r, 4) for r in range(4)]
    assert all(s.numel() == 25 for s in shards)
    assert torch.equal(torch.cat(shards), tokens[:100])
    with pytest.raises(ValueError, match="rank"):
        shard_tokens(tokens, 4, 4)


# ------------------------------------------------------------------------------ sampler


def shards(num_samples, world_size, epoch=0, **kw):
    out = []
    for r in range(world_size):
        s = ShardedSampler(num_samples, r, world_size, **kw)
        s.set_epoch(epoch)
        out.append(list(s))
    return out


def test_sampler_disjoint_equal_covering():
    parts = shards(100, 4, epoch=2, seed=7)
    assert [len(p) for p in parts] == [25] * 4
    assert sorted(sum(parts, [])) == list(range(100))
    parts = shards(103, 4, epoch=0)
    flat = sum(parts, [])
    assert [len(p) for p in parts] == [25] * 4 and len(set(flat)) == 100


def test_sampler_same_permutation_on_every_rank():
    # Interleaving the rank shards rebuilds exactly the epoch's seeded permutation.
    parts = shards(40, 4, epoch=3, seed=11)
    merged = [parts[i % 4][i // 4] for i in range(40)]
    expect = torch.randperm(40, generator=torch.Generator().manual_seed(11 + 3)).tolist()
    assert merged == expect
    assert shards(40, 4, epoch=3, seed=11) == parts


def test_sampler_reshuffles_per_epoch_and_no_shuffle():
    assert shards(50, 2, epoch=0) != shards(50, 2, epoch=1)
    assert shards(10, 2, shuffle=False) == [[0, 2, 4, 6, 8], [1, 3, 5, 7, 9]]


def test_sampler_resume_mid_epoch():
    full = ShardedSampler(60, 1, 3, seed=4)
    full.set_epoch(5)
    expect = list(full)
    resumed = ShardedSampler(60, 1, 3, seed=4)
    resumed.load_state_dict({"epoch": 5, "start": 7})
    assert list(resumed) == expect[7:] and len(resumed) == len(expect) - 7
    resumed.set_epoch(6)  # a new epoch starts from its beginning
    assert len(resumed) == 20


def test_sampler_no_drop_last_pads():
    parts = shards(10, 4, drop_last=False)
    assert [len(p) for p in parts] == [3] * 4
    assert set(sum(parts, [])) == set(range(10))


def test_sampler_bad_arguments():
    with pytest.raises(ValueError, match="rank"):
        ShardedSampler(10, 2, 2)
    with pytest.raises(ValueError, match="drop_last"):
        ShardedSampler(3, 0, 4)
    with pytest.raises(ValueError, match="start position"):
        ShardedSampler(10, 0, 2).set_start(6)


def test_tensor_batches_follow_sampler_order():
    images = torch.arange(20).view(20, 1).float()
    labels = torch.arange(20)
    sampler = ShardedSampler(20, 0, 2, seed=1)
    sampler.set_epoch(1)
    batches = TensorBatches(images, labels, 4, sampler, transform=lambda x: x * 10)
    assert len(batches) == 3
    got = list(batches)
    assert [len(y) for _, y in got] == [4, 4, 2]
    order = list(sampler)
    assert torch.cat([y for _, y in got]).tolist() == order
    assert torch.equal(got[0][0].view(-1), torch.tensor(order[:4]).float() * 10)
    assert len(TensorBatches(images, labels, 4, sampler, drop_last=True)) == 2
    with pytest.raises(ValueError, match="labels"):
        TensorBatches(images, labels[:3], 4, sampler)


# ------------------------------------------------------------------------------ digits


def test_digits_shapes_range_and_split():
    x, y = load_digits_dataset(train=True)
    xt, yt = load_digits_dataset(train=False)
    assert x.shape[1:] == (1, 8, 8) and x.dtype == torch.float32 and y.dtype == torch.int64
    assert len(x) + len(xt) == 1797 and len(xt) == round(1797 * 0.2)
    assert x.min() >= 0 and x.max() <= 1 and x.max() == 1
    assert set(y.tolist()) == set(range(10))
    x2, y2 = load_digits_dataset(train=True)
    assert torch.equal(x, x2) and torch.equal(y, y2)
    assert not torch.equal(load_digits_dataset(train=False, seed=1)[1], yt)
    with pytest.raises(ValueError, match="test_fraction"):
        load_digits_dataset(test_fraction=1.5)


# ------------------------------------------------------------------------------ synthetic


def test_synthetic_text_is_markov_and_deterministic():
    tokens = synthetic_text(20_000, vocab_size=50, seed=0)
    assert tokens.shape == (20_000,) and tokens.dtype == torch.int64
    assert tokens.min() >= 0 and tokens.max() < 50
    assert torch.equal(tokens, synthetic_text(20_000, vocab_size=50, seed=0))
    assert not torch.equal(tokens, synthetic_text(20_000, vocab_size=50, seed=1))
    # Learnable: the 4 most frequent successors of a token cover most transitions
    # (uniform noise would give about 4/50).
    counts = torch.zeros(50, 50)
    counts.index_put_((tokens[:-1], tokens[1:]), torch.ones(len(tokens) - 1), accumulate=True)
    top4 = counts.topk(4, dim=1).values.sum()
    assert top4 / counts.sum() > 0.85


def test_synthetic_text_zipf_makes_few_words_frequent_and_stays_learnable():
    tokens = synthetic_text(50_000, vocab_size=2000, seed=0, zipf=1.0)
    assert torch.equal(tokens, synthetic_text(50_000, vocab_size=2000, seed=0, zipf=1.0))
    counts = torch.bincount(tokens, minlength=2000).sort(descending=True).values
    uniform = torch.bincount(synthetic_text(50_000, vocab_size=2000, seed=0),
                             minlength=2000).sort(descending=True).values
    # Zipf: the 1% most frequent words carry half the text (uniform chain: ~4%), and
    # about half the words never occur in a stretch this short (uniform: ~1%).
    assert counts[:20].sum() > 0.4 * len(tokens) and uniform[:20].sum() < 0.1 * len(tokens)
    assert (counts == 0).sum() > 500 > 100 > (uniform == 0).sum()
    pairs = torch.zeros(2000, 2000)
    pairs.index_put_((tokens[:-1], tokens[1:]), torch.ones(len(tokens) - 1), accumulate=True)
    assert pairs.topk(4, dim=1).values.sum() / pairs.sum() > 0.85   # still a sparse chain
    with pytest.raises(ValueError, match="zipf"):
        synthetic_text(10, vocab_size=5, zipf=-1.0)


def test_synthetic_images_learnable_and_deterministic():
    images, labels = synthetic_images(400, num_classes=4, image_size=16, seed=0)
    assert images.shape == (400, 3, 16, 16) and images.dtype == torch.uint8
    assert labels.dtype == torch.int64 and torch.bincount(labels).tolist() == [100] * 4
    again = synthetic_images(400, num_classes=4, image_size=16, seed=0)
    assert torch.equal(images, again[0]) and torch.equal(labels, again[1])
    x = images.float().flatten(1)
    centroids = torch.stack([x[:200][labels[:200] == k].mean(0) for k in range(4)])
    pred = torch.cdist(x[200:], centroids).argmin(1)
    assert (pred == labels[200:]).float().mean() > 0.9


def test_digits_are_scikit_learns_read_without_importing_it():
    """The same images and labels as ``sklearn.datasets.load_digits`` (the reference), read
    from the file it ships without importing scikit-learn (a ~2 s import per process)."""
    from sklearn.datasets import load_digits

    ref = load_digits()
    x, y = load_digits_dataset(train=True)
    xt, yt = load_digits_dataset(train=False)
    order = torch.randperm(1797, generator=torch.Generator().manual_seed(0))
    n_test = round(1797 * 0.2)
    images = torch.as_tensor(ref.images, dtype=torch.float32).div(16.0).unsqueeze(1)
    labels = torch.as_tensor(ref.target, dtype=torch.int64)
    assert torch.equal(x, images[order[n_test:]]) and torch.equal(y, labels[order[n_test:]])
    assert torch.equal(xt, images[order[:n_test]]) and torch.equal(yt, labels[order[:n_test]])
