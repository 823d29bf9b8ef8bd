"""gravac in PyTorch Lightning: the DDP communication hook on Lightning's "ddp" strategy.

Trains gravac's SmallCNN on scikit-learn's handwritten digits (no download) on 2 CPU ranks
(gloo). Lightning keeps its loop, its optimizer and its checkpoints; only how the gradients
travel changes: Top-k with error feedback, the CF chosen by GraVAC (or a static CF).

    .venv/bin/python examples/lightning_ddp_hook.py --steps 200 --out runs/lightning_hook

Lightning starts the second rank itself (it runs this script again as a subprocess). The
hook is registered by the small ``GravacCommHook`` callback below, which works on CPU and
GPU alike. On GPUs Lightning's strategy can register it too, in one line::

    strategy = DDPStrategy(ddp_comm_state=state, ddp_comm_hook=gravac_hook)

but only there: ``DDPStrategy`` registers ``ddp_comm_hook`` when its device is CUDA and
silently ignores it otherwise (lightning/pytorch/strategies/ddp.py, ``_register_ddp_hooks``).

What it writes under ``--out``: ``csv/`` and ``tensorboard/`` (the hook's scalars per step:
``compression/cf_sent``, ``traffic/floats_sent``, ... next to ``train/loss``),
``checkpoints/*.ckpt`` (Lightning's checkpoint; its optimizer state holds the hook's state
under ``"gravac"``) and ``hook_state_rank{r}.pt`` (each rank's own hook state). At the end
rank 0 prints one JSON line: losses, the hook's step count on every rank, the last CF sent,
and whether every rank's parameters equal rank 0's.

Residuals are per rank, and Lightning writes its checkpoint on rank 0 only: its ``"gravac"``
entry is rank 0's. To resume exactly, load the checkpoint (``ckpt_path=``), then, before
the first step, each rank's own file: ``state.load_state_dict(torch.load(
f"hook_state_rank{rank}.pt", map_location="cpu"))``.
"""
import argparse
import json
import warnings
from pathlib import Path

import lightning as L
import torch
import torch.distributed as dist
import torch.nn.functional as F
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger
from torch.utils.data import DataLoader, TensorDataset

from gravac.comm import end_process
from gravac.controllers import GraVAC, Static
from gravac.data import load_digits_dataset
from gravac.models import SmallCNN
from gravac.torch.hooks import GravacHookState, gravac_hook, optimizer_with_hook_state


def make_controller(args):
    if args.controller == "static":
        return Static(cf=args.cf)
    # Short windows so that a short run sees GraVAC's decisions (the paper's: 500 steps).
    return GraVAC(theta_min=args.cf, theta_max=args.theta_max, window=args.window)


class DigitsClassifier(L.LightningModule):
    """SmallCNN on digits. ``configure_optimizers`` also builds the hook's state (it needs
    the optimizer, to hear of learning-rate decays) and hands it to Lightning inside the
    optimizer's state dict, so Lightning's checkpoints carry it."""

    def __init__(self, args):
        super().__init__()
        self.args = args
        self.net = SmallCNN(num_classes=10, in_channels=1, image_size=8)
        self.gravac_state: GravacHookState | None = None
        self.losses: list[float] = []

    def forward(self, x):
        return self.net(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.cross_entropy(self(x), y)
        self.losses.append(loss.item())
        self.log("train/loss", loss, on_step=True, on_epoch=False)
        return loss

    def configure_optimizers(self):
        opt = torch.optim.SGD(self.parameters(), lr=self.args.lr, momentum=0.9)
        self.gravac_state = GravacHookState(self, compressor="topk",
                                            controller=make_controller(self.args),
                                            optimizer=opt, batch_size=self.args.batch_size)
        return optimizer_with_hook_state(opt, self.gravac_state)


class GravacCommHook(L.Callback):
    """Registers ``pl_module.gravac_state`` with ``gravac_hook`` on Lightning's DDP model,
    logs the hook's numbers after every step and tells it when an epoch ends.

    Why a callback and not ``DDPStrategy(ddp_comm_hook=...)``: the strategy registers a
    communication hook only when its device is CUDA and silently drops it on CPU. By
    ``on_fit_start`` the strategy has wrapped the module in DistributedDataParallel (and
    called ``configure_optimizers``), and no backward has run yet: the moment
    ``register_comm_hook`` needs, on any device.
    """

    def on_fit_start(self, trainer, pl_module):
        ddp = trainer.strategy.model
        if not isinstance(ddp, torch.nn.parallel.DistributedDataParallel):
            raise ValueError(f"GravacCommHook needs a DDP strategy (strategy='ddp'); the "
                             f"model is a {type(ddp).__name__}")
        ddp.register_comm_hook(pl_module.gravac_state, gravac_hook)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        # The same on every rank but the timings; Lightning's loggers write rank 0's.
        pl_module.log_dict(pl_module.gravac_state.scalars(), on_step=True, on_epoch=False)

    def on_train_epoch_end(self, trainer, pl_module):
        pl_module.gravac_state.on_epoch_end()     # Accordion's default interval


def test_loss(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    with torch.no_grad():
        return F.cross_entropy(model(x), y).item()


def parameters_equal_rank0(model: torch.nn.Module) -> bool:
    """Whether this rank's parameters are bit for bit rank 0's (collective)."""
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    ref = flat.clone()
    dist.broadcast(ref, src=0)
    return torch.equal(flat, ref)


def main(args):
    torch.set_num_threads(1)            # two ranks share the cores
    warnings.filterwarnings("ignore", message=".*does not have many workers.*")
    L.seed_everything(args.seed, verbose=False)
    out = Path(args.out)
    x, y = load_digits_dataset(train=True)
    test_x, test_y = load_digits_dataset(train=False)
    # Lightning shards the loader across ranks (it adds a DistributedSampler).
    loader = DataLoader(TensorDataset(x, y), batch_size=args.batch_size, shuffle=True,
                        drop_last=True)
    model = DigitsClassifier(args)
    loss_before = test_loss(model, test_x, test_y)

    checkpoint = ModelCheckpoint(dirpath=out / "checkpoints", filename="{step}",
                                 every_n_train_steps=args.steps)
    trainer = L.Trainer(accelerator="cpu", devices=2, strategy="ddp", max_steps=args.steps,
                        callbacks=[GravacCommHook(), checkpoint],
                        logger=[CSVLogger(out, name="csv", version=""),
                                TensorBoardLogger(out, name="tensorboard", version="")],
                        log_every_n_steps=args.log_every, enable_progress_bar=False,
                        enable_model_summary=False)
    trainer.fit(model, loader)

    # The process group lives on after fit (Lightning's teardown keeps it).
    state = model.gravac_state
    rank = trainer.global_rank
    torch.save(state.state_dict(), out / f"hook_state_rank{rank}.pt")
    n = 5
    mine = {"rank": rank, "hook_steps": state.step_count,
            "params_equal_rank0": parameters_equal_rank0(model),
            "train_loss_first": sum(model.losses[:n]) / len(model.losses[:n]),
            "train_loss_last": sum(model.losses[-n:]) / len(model.losses[-n:])}
    ranks = [None] * trainer.world_size
    dist.all_gather_object(ranks, mine)
    if rank == 0:
        stats = state.last_stats
        print(json.dumps({
            "example": "lightning", "world_size": trainer.world_size,
            "steps": trainer.global_step, "controller": args.controller,
            "hook_steps": [r["hook_steps"] for r in ranks],
            "params_equal_rank0": [r["params_equal_rank0"] for r in ranks],
            "train_loss_first": sum(r["train_loss_first"] for r in ranks) / len(ranks),
            "train_loss_last": sum(r["train_loss_last"] for r in ranks) / len(ranks),
            "test_loss_before": loss_before, "test_loss_after": test_loss(model, test_x, test_y),
            "last_sent": stats.sent, "last_cf": stats.cf, "last_cf_actual": stats.cf_actual,
            "checkpoint": checkpoint.last_model_path or checkpoint.best_model_path,
            "metrics_csv": str(out / "csv" / "metrics.csv"),
        }), flush=True)
    dist.barrier()                      # every rank is done with its collectives


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200, help="optimizer steps (max_steps)")
    parser.add_argument("--out", default="runs/lightning_hook",
                        help="folder for logs, checkpoints and the hook's state")
    parser.add_argument("--controller", choices=("gravac", "static"), default="gravac")
    parser.add_argument("--cf", type=float, default=10.0,
                        help="static CF, or GraVAC's initial minimum CF (theta_min)")
    parser.add_argument("--theta-max", type=float, default=1000.0, help="GraVAC's largest CF")
    parser.add_argument("--window", type=int, default=10, help="GraVAC's steps per window")
    parser.add_argument("--batch-size", type=int, default=32, help="per rank")
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--log-every", type=int, default=5, help="log every N steps")
    parser.add_argument("--seed", type=int, default=0)
    main(parser.parse_args())
    # After gloo, exit without the interpreter's finalization: gloo's worker threads
    # outlive the process group, and one still releasing a collective's tensors while
    # the interpreter finalizes aborts the rank ("terminate called without an active
    # exception"; gravac/comm/process_exit.py).
    end_process(0)
