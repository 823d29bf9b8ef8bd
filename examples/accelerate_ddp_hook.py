"""gravac in Hugging Face Accelerate: the DDP communication hook on the prepared model.

Trains gravac's SmallCNN on scikit-learn's handwritten digits (no download) on 2 CPU ranks
(gloo). Accelerate keeps its loop, its optimizer and ``save_state``; only how the gradients
travel changes: Top-k with error feedback, the CF chosen by GraVAC (or a static CF).

    .venv/bin/torchrun --standalone --nproc-per-node 2 examples/accelerate_ddp_hook.py \\
        --steps 200 --out runs/accelerate_hook

(``accelerate launch --cpu --num_processes 2`` starts one process only, not two:
launch with torchrun.) ``accelerator.prepare`` returns
a plain ``DistributedDataParallel``; the hook is registered on it, after ``prepare`` and
before the first backward::

    model, opt, loader = accelerator.prepare(model, opt, loader)
    model.register_comm_hook(state, gravac_hook)

Not through ``DistributedDataParallelKwargs(comm_hook=...)``: that takes Accelerate's own
``DDPCommunicationHookType`` names only and silently ignores a callable.

What it writes under ``--out``: ``tensorboard/`` (the hook's scalars per logged step:
``compression/cf_sent``, ``traffic/floats_sent``, ... next to ``train/loss``, through
``accelerator.log``), ``state/`` (``accelerator.save_state``: the model, and the optimizer,
whose state dict holds the hook's state under ``"gravac"``) and ``hook_state_rank{r}.pt``
(each rank's own hook state: residuals are per rank, and ``save_state`` writes the
optimizer on rank 0 only). At the end rank 0 prints one JSON line: losses, the hook's step
count on every rank, the last CF sent, and whether every rank's parameters equal rank 0's.
"""
import argparse
import json
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from accelerate import Accelerator
from accelerate.utils import ProjectConfiguration, set_seed
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
    out = Path(args.out)
    accelerator = Accelerator(cpu=True, log_with="tensorboard",
                              project_config=ProjectConfiguration(project_dir=str(out),
                                                                  logging_dir=str(out)))
    set_seed(args.seed)
    x, y = load_digits_dataset(train=True)
    test_x, test_y = load_digits_dataset(train=False)
    loader = DataLoader(TensorDataset(x, y), batch_size=args.batch_size, shuffle=True,
                        drop_last=True)
    model = SmallCNN(num_classes=10, in_channels=1, image_size=8)
    loss_before = test_loss(model, test_x, test_y)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    state = GravacHookState(model, compressor="topk", controller=make_controller(args),
                            optimizer=opt, batch_size=args.batch_size)
    # The optimizer's state dict now carries the hook's: save_state checkpoints it too.
    opt = optimizer_with_hook_state(opt, state)

    # prepare shards the loader across ranks and wraps the model in DDP.
    model, opt, loader = accelerator.prepare(model, opt, loader)
    if not isinstance(model, torch.nn.parallel.DistributedDataParallel):
        # One line, not a traceback: the fix is how it was started.
        raise SystemExit(f"accelerate_ddp_hook.py: accelerator.prepare returned a "
                         f"{type(model).__name__}, not DistributedDataParallel (one process): "
                         "launch with torchrun --standalone --nproc-per-node 2 (accelerate "
                         "launch --cpu starts one process here)")
    model.register_comm_hook(state, gravac_hook)
    accelerator.init_trackers("tensorboard")

    losses: list[float] = []
    step = 0
    while step < args.steps:
        for xb, yb in loader:
            loss = F.cross_entropy(model(xb), yb)
            accelerator.backward(loss)
            opt.step()
            opt.zero_grad()
            losses.append(loss.item())
            step += 1
            if step % args.log_every == 0 or step == args.steps:
                # The same on every rank but the timings; only rank 0's trackers write.
                accelerator.log({"train/loss": losses[-1], **state.scalars()}, step=step)
            if step == args.steps:
                break
        state.on_epoch_end()            # Accordion's default interval

    accelerator.save_state(str(out / "state"))
    rank = accelerator.process_index
    torch.save(state.state_dict(), out / f"hook_state_rank{rank}.pt")

    net = accelerator.unwrap_model(model)
    n = 5
    mine = {"rank": rank, "hook_steps": state.step_count,
            "params_equal_rank0": parameters_equal_rank0(net),
            "train_loss_first": sum(losses[:n]) / len(losses[:n]),
            "train_loss_last": sum(losses[-n:]) / len(losses[-n:])}
    ranks = [None] * accelerator.num_processes
    dist.all_gather_object(ranks, mine)
    if accelerator.is_main_process:
        stats = state.last_stats
        print(json.dumps({
            "example": "accelerate", "world_size": accelerator.num_processes, "steps": step,
            "controller": args.controller,
            "hook_steps": [r["hook_steps"] for r in ranks],
            "params_equal_rank0": [r["params_equal_rank0"] for r in ranks],
            "train_loss_first": sum(r["train_loss_first"] for r in ranks) / len(ranks),
            "train_loss_last": sum(r["train_loss_last"] for r in ranks) / len(ranks),
            "test_loss_before": loss_before, "test_loss_after": test_loss(net, test_x, test_y),
            "last_sent": stats.sent, "last_cf": stats.cf, "last_cf_actual": stats.cf_actual,
            "state_dir": str(out / "state"), "tensorboard_dir": str(out / "tensorboard"),
        }), flush=True)
    # Every rank done before the process group goes: a rank that tears its Gloo pairs down
    # while the other still reads them aborts ("terminate called without an active
    # exception"). Last: it closes the trackers and destroys the process group.
    accelerator.wait_for_everyone()
    accelerator.end_training()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200, help="optimizer steps")
    parser.add_argument("--out", default="runs/accelerate_hook",
                        help="folder for logs, the saved state and the hook's state")
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
    # the interpreter finalizes aborts the rank (gravac/comm/process_exit.py).
    end_process(0)
