"""Checkpoints: every rank's state, written atomically, with a pointer to the latest.

Layout under ``RUN_DIR/checkpoints/``::

    step_00000200/common.pt      rank 0: model, lr scheduler, loop position, config
    step_00000200/rank_00000.pt  each rank: its optimizer state (residual memory, controller),
    step_00000200/rank_00001.pt  RNG states and data position (augmentation, LSTM state)
    latest.json                  {"step": 200, "dir": "step_00000200", "world_size": 2}

Each file is written to a temporary name and renamed. ``latest.json`` is rewritten only
after every rank has written its file (a small allreduce is the barrier), so it always
names a complete checkpoint; a crash mid-save leaves the previous one in place. A write
that fails (a full disk) on any rank, ``latest.json`` included, fails the save on every
rank alike: the new folder is removed and ``CheckpointError`` says which file and why.

Example::

    save_checkpoint(run_dir, step, common, rank_state, comm, keep=2)
    found = load_checkpoint(run_dir, comm)     # (common, rank_state, info) or None
"""
from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

import torch

from ..util.atomic import NO_SPACE, atomic_torch_save, atomic_write_text, write_problem

LATEST = "latest.json"


class CheckpointError(RuntimeError):
    """A checkpoint could not be written (every rank raises it; the previous one is kept)."""


def checkpoint_root(run_dir: str | Path) -> Path:
    return Path(run_dir) / "checkpoints"


def rng_state() -> dict:
    """The generators a step draws from: torch's CPU one, Python's, and this rank's GPU's
    (dropout on a GPU draws there) when CUDA is in use."""
    cuda = torch.cuda.get_rng_state() if torch.cuda.is_initialized() else None
    return {"torch": torch.get_rng_state(), "python": random.getstate(), "cuda": cuda}


def set_rng_state(state: dict) -> None:
    """Put back what ``rng_state`` saved; a GPU state only where a GPU is in use (a run
    moved from GPU to CPU draws its dropout masks afresh)."""
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    if state.get("cuda") is not None and torch.cuda.is_initialized():
        torch.cuda.set_rng_state(state["cuda"])


def save_checkpoint(run_dir, step: int, common: dict, rank_state: dict, comm,
                    keep: int = 2) -> Path:
    """Collective over ``comm`` (a ``gravac.comm.Comm``): every rank calls it at the same
    step."""
    rank, world_size = comm.rank, comm.size
    root = checkpoint_root(run_dir)
    name = f"step_{step:08d}"
    folder = root / name
    problem = None
    writing = folder / f"rank_{rank:05d}.pt"
    try:
        atomic_torch_save(rank_state, writing)
        if rank == 0:
            writing = folder / "common.pt"
            atomic_torch_save(common, writing)
    except OSError as exc:
        problem = _write_problem(exc, writing, step)
    # Also the barrier: no rank names the checkpoint before every rank has written its file,
    # and a rank whose write failed tells the others instead of leaving them waiting.
    _agree_or_discard(problem, root, folder, step, comm, f"gravac.checkpoint.{step}")
    if rank == 0:
        try:
            atomic_write_text(root / LATEST, json.dumps({"step": step, "dir": name,
                                                         "world_size": world_size}))
        except OSError as exc:
            problem = _write_problem(exc, root / LATEST, step)
        else:
            _prune(root, keep, current=name)
    # Also the barrier: when save returns, the checkpoint is complete and named by
    # latest.json on every rank (or it failed on every rank).
    _agree_or_discard(problem, root, folder, step, comm, f"gravac.checkpoint.{step}.done")
    return folder


def _agree_or_discard(problem: str | None, root: Path, folder: Path, step: int, comm,
                      name: str) -> None:
    """Collective: every rank learns whether a rank's ``problem`` failed the save; if one
    did, every rank removes the new folder and raises CheckpointError."""
    failed = torch.zeros(comm.size)
    failed[comm.rank] = float(problem is not None)
    failed = comm.allreduce(failed, op="sum", name=name)
    if bool(failed.any()):
        _discard_partial(root, folder)   # every rank (shared or local disks): no leftovers
        comm.barrier(f"{name}.discarded")
        ranks = [r for r, f in enumerate(failed.tolist()) if f]
        raise CheckpointError(problem or f"the checkpoint of step {step} failed on rank(s) "
                                         f"{ranks}; the previous checkpoint is kept")


def _write_problem(exc: OSError, path: Path, step: int) -> str:
    said = (f"{write_problem(exc, path)}: the checkpoint of step {step} was not written (the "
            "previous one is kept)")
    return said + ("; free space, or lower run.keep_checkpoints" if exc.errno in NO_SPACE else "")


def _discard_partial(root: Path, folder: Path) -> None:
    """Remove a failed save's folder unless latest.json names it (a re-save of the step
    latest.json names keeps the complete files it had)."""
    info = latest_info(root.parent)
    if info is not None and info["dir"] == folder.name:
        return
    shutil.rmtree(folder, ignore_errors=True)


def _prune(root: Path, keep: int, current: str) -> None:
    """Keep the newest ``keep`` checkpoints up to ``current``. Folders after it are from
    before a resume that fell back from them (a corrupt or unfinished checkpoint): they
    are never the ones to keep."""
    folders = sorted(p for p in root.glob("step_*") if p.is_dir())
    for stale in (p for p in folders if p.name > current):
        shutil.rmtree(stale, ignore_errors=True)
    kept = [p for p in folders if p.name <= current]
    for old in kept[:-keep]:
        if old.name != current:
            shutil.rmtree(old, ignore_errors=True)


def latest_info(run_dir) -> dict | None:
    path = checkpoint_root(run_dir) / LATEST
    if not path.is_file():
        return None
    try:
        info = json.loads(path.read_text())
        return info if {"step", "dir", "world_size"} <= set(info) else None
    except (OSError, ValueError):
        return None


def _candidates(run_dir) -> list[dict]:
    """The latest complete checkpoint, then the older ones, newest first.

    A folder newer than latest.json is a save that crashed midway: never a candidate.
    """
    info = latest_info(run_dir)
    if info is None:
        return _scanned(run_dir) if (checkpoint_root(run_dir) / LATEST).exists() else []
    root = checkpoint_root(run_dir)
    older = sorted((p for p in root.glob("step_*") if p.is_dir() and p.name < info["dir"]),
                   reverse=True)
    return [info] + [{"step": int(p.name.split("_")[1]), "dir": p.name,
                      "world_size": info["world_size"]} for p in older]


def _scanned(run_dir) -> list[dict]:
    """With latest.json unreadable: the step folders holding common.pt, newest first, each
    with the world size its rank files show."""
    found = []
    for folder in sorted(checkpoint_root(run_dir).glob("step_*"), reverse=True):
        ranks = [int(p.stem.split("_")[1]) for p in folder.glob("rank_*.pt")]
        if folder.is_dir() and (folder / "common.pt").is_file() and ranks:
            found.append({"step": int(folder.name.split("_")[1]), "dir": folder.name,
                          "world_size": max(ranks) + 1})
    return found


def saved_config(run_dir) -> tuple[dict, Path] | None:
    """The config the newest readable checkpoint was saved with (common.pt's), and that
    file; None where no checkpoint holds one. What ``--resume`` compares with when the
    run's config.yaml is gone (a run folder copied without it)."""
    for info in _candidates(run_dir):
        path = checkpoint_root(run_dir) / info["dir"] / "common.pt"
        try:
            common = torch.load(path, map_location="cpu", weights_only=False)
        except Exception:  # noqa: BLE001 - unusable for any reason: try an older one
            continue
        if isinstance(common, dict) and isinstance(common.get("config"), dict):
            return common["config"], path
    return None


def has_checkpoint(run_dir) -> bool:
    """Whether ``--resume`` has anything to try (latest.json, or step folders to scan)."""
    return bool(_candidates(run_dir))


def _read(folder: Path, rank: int, world_size: int):
    """(common, rank_state) or the reason they cannot be used. The world size is common.pt's
    where it says one (a folder scanned without latest.json shows only the rank files that
    were written: a save cut short on one rank looked like a smaller job's)."""
    rank_file = folder / f"rank_{rank:05d}.pt"
    try:
        common = torch.load(folder / "common.pt", map_location="cpu", weights_only=False)
    except Exception as exc:  # noqa: BLE001 - truncated zip, bad pickle, I/O error: all unusable
        return None, f"{type(exc).__name__}: {exc}"
    missing = {"model", "scheduler", "step"} - set(common) if isinstance(common, dict) else {"all"}
    if missing:
        return None, f"common.pt lacks {sorted(missing)}"
    if rank < common.get("world_size", world_size) and not rank_file.is_file():
        return None, f"{rank_file.name} is missing"
    try:
        rank_state = (torch.load(rank_file, map_location="cpu", weights_only=False)
                      if rank_file.is_file() else None)
    except Exception as exc:  # noqa: BLE001
        return None, f"{type(exc).__name__}: {exc}"
    if rank_state is not None and not {"optimizer", "rng", "task"} <= set(rank_state):
        return None, f"rank_{rank:05d}.pt is incomplete"
    return (common, rank_state), None


def load_checkpoint(run_dir, comm, log=print):
    """Collective: (common, rank_state, info) of the newest checkpoint every rank can read.

    A truncated or corrupt file makes every rank skip that checkpoint (agreed with one tiny
    allreduce per candidate) and try the previous one; ``log`` is told why. Returns None
    when there is no checkpoint. A rank that did not exist when the checkpoint was written
    gets ``rank_state = None`` (it starts with empty residuals).
    """
    rank = comm.rank
    candidates = comm.broadcast_object(_candidates(run_dir), name="gravac.checkpoint.candidates")
    if rank == 0 and candidates and latest_info(run_dir) is None:
        log(f"{checkpoint_root(run_dir) / LATEST} is unreadable; trying the step folders, "
            f"newest first ({', '.join(c['dir'] for c in candidates)})")
    for i, info in enumerate(candidates):
        folder = checkpoint_root(run_dir) / info["dir"]
        loaded, problem = _read(folder, rank, info["world_size"])
        bad = torch.zeros(comm.size)
        if problem is not None:
            bad[rank] = 1.0
        bad = comm.allreduce(bad, op="sum", name=f"gravac.checkpoint.check.{i}")
        if not bool(bad.any()):
            # common.pt's world size (the same file on every rank) over a scan's guess
            return loaded[0], loaded[1], {**info, "world_size": loaded[0].get(
                "world_size", info["world_size"])}
        if problem is not None:
            log(f"checkpoint {folder} cannot be used on rank {rank} ({problem})")
        if rank == 0:
            ranks = [r for r, b in enumerate(bad.tolist()) if b]
            log(f"checkpoint {folder} is unreadable on rank(s) {ranks}"
                + ("; trying an earlier one" if i + 1 < len(candidates) else ""))
    if candidates:
        raise CheckpointError(f"no readable checkpoint in {checkpoint_root(run_dir)} (tried "
                              f"{', '.join(c['dir'] for c in candidates)}); start a new run "
                              "(run.overwrite=true) or restore a checkpoint")
    return None
