"""How a run averages gradients, chosen once: Horovod's optimizer, PyTorch DDP, gravac's
optimizer or gravac as DDP's communication hook (``compression.front_end: ddp_hook``).

``compression.controller: dense`` is what a user would run without gravac: on Horovod
plain ``hvd.DistributedOptimizer`` (``Compression.fp16`` with ``dense_wire: fp16``); on
torch.distributed PyTorch DDP (its fp16 or PowerSGD communication hook); in one process
(the local transport, ``--dry-run``) gravac's optimizer with no compression, as there is
nothing to baseline against. Every other controller is gravac's optimizer.

``build_method(cfg, comm)`` makes that choice; the trainer then asks the ``Method``, not
the config, how to wrap the model, which optimizer to build and step, what to describe
and log, and where the step record comes from.

Example::

    method = build_method(cfg, comm)           # HorovodAllreduce, TorchDDP or Gravac
    opt = method.build_optimizer(model)
    forward_model = method.wrap_model(model)   # DDP(model), or the model itself
    print(method.describe(opt))                # "dense Horovod allreduce (compression none)"
    method.start_fields()                      # {"controller": "dense", "compressor": "none"}
    ...
    method.step(opt, model.parameters(), grad_clip=None)
    stats = method.step_stats(opt, step, dense_numel)
"""
from __future__ import annotations

import abc
import dataclasses
import os

import torch

from ..comm import Comm
from ..controllers import SENT_MIN
from ..engine import StepStats, wrap_optimizer
from ..util import sizes
from .config import (Config, build_controller, engine_options, exchanges_named,
                     refuse_ddp_only)


def dense_fp16(cfg: Config) -> bool:
    """Whether dense gradients travel as fp16 (Horovod's ``Compression.fp16``, DDP's
    ``fp16_compress_hook``, gravac's ``dense_wire="fp16"``): the one place that reads it
    from the config."""
    return cfg.compression.dense_wire == "fp16"


def build_sgd(o, model: torch.nn.Module) -> torch.optim.SGD:
    """SGD as ``optimizer`` configures it. ``implementation: auto`` takes torch's fused
    kernel when it supports the parameters (on CPU ~4x faster than the default per-tensor
    loop over the LSTM's 5.4M parameters; the same update up to rounding in the last bit),
    else torch's own default."""
    kwargs = dict(lr=o.lr, momentum=o.momentum, weight_decay=o.weight_decay, nesterov=o.nesterov)
    impl = o.implementation
    if impl == "auto":
        try:
            return torch.optim.SGD(model.parameters(), fused=True, **kwargs)
        except (RuntimeError, ValueError, TypeError):
            return torch.optim.SGD(model.parameters(), **kwargs)
    flags = {"fused": {"fused": True}, "foreach": {"foreach": True},
             "loop": {"foreach": False}}[impl]
    return torch.optim.SGD(model.parameters(), **flags, **kwargs)


def prepare_environment(cfg: Config) -> None:
    """What the method needs set before the transport starts (``gravac.comm.init``)."""
    if "hierarchical" in exchanges_named(cfg.compression):
        # Its host groups are Horovod process sets made at run time (an Auto method's at
        # its first step); Horovod reads this at hvd.init().
        os.environ.setdefault("HOROVOD_DYNAMIC_PROCESS_SETS", "1")


class Method(abc.ABC):
    """One way of averaging gradients, built from the config and the transport."""

    #: "horovod", "ddp", "gravac" or "gravac_ddp_hook".
    kind: str = ""
    #: Bytes of one value on the baselines' wire (read at the first step record).
    _width: int | None = None

    def __init__(self, cfg: Config, comm: Comm):
        self.cfg, self.comm = cfg, comm

    @abc.abstractmethod
    def build_optimizer(self, model: torch.nn.Module, defer_agreement: bool = False):
        """The optimizer the loop steps (``defer_agreement``: gravac's, under elastic)."""

    @abc.abstractmethod
    def describe(self, opt) -> str:
        """The run's "method" line (after the model line of ``Trainer.describe``)."""

    def wrap_model(self, model: torch.nn.Module) -> torch.nn.Module:
        """The module the task's forward (and so backward) runs through. Collective for
        DDP; checkpoints and evaluation keep using the bare model."""
        return model

    def start_fields(self) -> dict:
        """The run_start record's ``controller`` and ``compressor`` (for dense baselines
        the compressor names how dense travels: none, fp16 or DDP's PowerSGD hook)."""
        c = self.cfg.compression
        if c.controller != "dense":
            compressor = c.compressor
        elif c.ddp_powersgd_rank is not None:
            compressor = f"ddp_powersgd_rank{c.ddp_powersgd_rank}"
        else:
            compressor = "fp16" if dense_fp16(self.cfg) else "none"
        return {"controller": c.controller, "compressor": compressor}

    def step(self, opt, parameters, grad_clip: float | None) -> None:
        """One optimizer step. With ``grad_clip``, the averaged gradient is clipped: the
        optimizer averages first (``synchronize``), as Horovod advises, then steps."""
        if grad_clip is None:
            opt.step()
            return
        opt.synchronize()
        torch.nn.utils.clip_grad_norm_(parameters, grad_clip)
        with opt.skip_synchronize():
            opt.step()

    def begin_step(self, opt) -> None:
        """A training step begins: what ran since the last one (evaluation, checkpoint,
        logging) is not in its time (gravac's controllers measure step time)."""

    def step_stats(self, opt, step: int, dense_numel: int) -> StepStats:
        """The step record of the step just taken (0-based ``step``): a plain dense
        allreduce of ``dense_numel`` elements for the baselines, at the wire's width (2
        bytes a value under fp16)."""
        if self._width is None:     # the parameters and the wire are fixed: read once
            self._width = 2 if dense_fp16(self.cfg) else _value_bytes(opt)
        return StepStats.dense(step, dense_numel, bytes_sent=self._width * dense_numel)

    def controller(self, opt):
        """The controller that plans what is sent (window decisions, epoch ends), or None."""
        return None

    def reset_world(self, opt, comm: Comm) -> None:
        """Re-attach the optimizer to a new set of ranks (an elastic reset). Collective."""


class HorovodAllreduce(Method):
    """Dense on Horovod: plain ``hvd.DistributedOptimizer``."""

    kind = "horovod"

    def build_optimizer(self, model, defer_agreement=False):
        import horovod.torch as hvd

        compression = hvd.Compression.fp16 if dense_fp16(self.cfg) else hvd.Compression.none
        return hvd.DistributedOptimizer(build_sgd(self.cfg.optimizer, model),
                                        named_parameters=model.named_parameters(),
                                        compression=compression,
                                        process_set=self.comm.process_set)

    def describe(self, opt) -> str:
        return f"dense Horovod allreduce (compression {'fp16' if dense_fp16(self.cfg) else 'none'})"


class TorchDDP(Method):
    """Dense on torch.distributed: PyTorch DDP (its fp16 or PowerSGD hook), which averages
    during backward; the optimizer is plain SGD."""

    kind = "ddp"
    _powersgd_floats: int | None = None

    def build_optimizer(self, model, defer_agreement=False):
        return build_sgd(self.cfg.optimizer, model)

    def wrap_model(self, model):
        from ..torch.ddp import wrap_ddp

        c = self.cfg.compression
        return wrap_ddp(model, self.comm, fp16=dense_fp16(self.cfg),
                        powersgd_rank=c.ddp_powersgd_rank,
                        start_powersgd_iter=c.ddp_start_powersgd_iter, seed=self.cfg.run.seed)

    def describe(self, opt) -> str:
        c = self.cfg.compression
        hook = ("fp16" if dense_fp16(self.cfg) else
                f"PowerSGD rank {c.ddp_powersgd_rank} from step {c.ddp_start_powersgd_iter}"
                if c.ddp_powersgd_rank is not None else "none")
        return f"dense PyTorch DDP (hook: {hook})"

    def step(self, opt, parameters, grad_clip):
        # DDP averaged during backward: the gradients are final already.
        if grad_clip is not None:
            torch.nn.utils.clip_grad_norm_(parameters, grad_clip)
        opt.step()

    def step_stats(self, opt, step, dense_numel):
        """Dense (the plain hook, fp16, or PowerSGD's first ``ddp_start_powersgd_iter``
        steps), else what DDP's PowerSGD hook sends, which it does not report: its P and Q
        factors for each gradient it compresses, the rest whole (PyTorch's own rule:
        ``_should_compress`` at its ``min_compression_rate`` of 2, each gradient viewed as
        (shape[0], -1))."""
        c = self.cfg.compression
        if c.ddp_powersgd_rank is None or step < c.ddp_start_powersgd_iter:
            return super().step_stats(opt, step, dense_numel)
        floats = self._powersgd_floats
        if floats is None:      # the parameters are fixed: counted at the hook's first step
            floats = self._powersgd_floats = sum(
                _powersgd_hook_values(p.shape, c.ddp_powersgd_rank) for p in _trained(opt))
        if self._width is None:
            self._width = _value_bytes(opt)
        return StepStats(step=step, sent=SENT_MIN, cf=dense_numel / floats,
                         floats_sent=floats, dense_floats=dense_numel,
                         bytes_sent=self._width * floats)


class Gravac(Method):
    """gravac's distributed optimizer (``wrap_optimizer``) with the configured compressor,
    controller and engine options; with ``controller: dense`` (one process only) its
    uncompressed path."""

    kind = "gravac"

    @property
    def dense(self) -> bool:
        return self.cfg.compression.controller == "dense"

    def build_optimizer(self, model, defer_agreement=False):
        c = self.cfg.compression
        return wrap_optimizer(
            build_sgd(self.cfg.optimizer, model), model.named_parameters(), self.comm,
            compressor="none" if self.dense else c.compressor,
            compressor_options=None if self.dense else c.compressor_options,
            controller=build_controller(c),
            # The engine's options, as the config's compression section sets them.
            **dataclasses.asdict(engine_options(self.cfg, batch_size=self.cfg.data.batch_size,
                                                defer_agreement=defer_agreement)))

    def describe(self, opt) -> str:
        c = self.cfg.compression
        if self.dense:
            return (f"dense: gravac's uncompressed allreduce over {self.comm.backend} "
                    f"(fp16: {dense_fp16(self.cfg)})")
        names = opt.compressed_layer_names
        return (f"compressor {c.compressor}, controller {opt.controller!r}; {len(names)} of "
                f"{len(opt.layer_names)} layers compressed"
                + ("" if opt.buckets is None else
                   f"; overlapped with backward in {len(opt.buckets)} bucket(s)")
                + ("" if c.exchange == "allgather" else f"; exchange {c.exchange}"))

    def begin_step(self, opt):
        opt.restart_step_clock()

    def step_stats(self, opt, step, dense_numel):
        return opt.last_stats

    def controller(self, opt):
        return opt.controller

    def reset_world(self, opt, comm):
        opt.reset_world(comm)


class GravacDDPHook(Method):
    """gravac's compression as PyTorch DDP's communication hook (``compression.front_end:
    ddp_hook``, gravac/torch/hooks.py): DDP averages during backward through gravac's
    pipeline; the optimizer is plain SGD whose state dict carries the hook's state."""

    kind = "gravac_ddp_hook"

    def build_optimizer(self, model, defer_agreement=False):
        from ..torch.hooks import GravacHookState, optimizer_with_hook_state

        c = self.cfg.compression
        options = dataclasses.asdict(engine_options(self.cfg, batch_size=self.cfg.data.batch_size))
        for name in ("overlap", "bucket_cap_mb", "backward_passes_per_step"):
            options.pop(name)            # DDP's buckets (wrap_model)
        sgd = build_sgd(self.cfg.optimizer, model)
        self.state = GravacHookState(model, compressor=c.compressor,
                                     compressor_options=c.compressor_options,
                                     controller=build_controller(c),
                                     process_group=self.comm.group, optimizer=sgd, **options)
        return optimizer_with_hook_state(sgd, self.state)

    def wrap_model(self, model):
        from ..torch.ddp import wrap_ddp
        from ..torch.hooks import gravac_hook

        c = self.cfg.compression
        return wrap_ddp(model, self.comm, comm_hook=(self.state, gravac_hook),
                        bucket_cap_mb=c.bucket_cap_mb if c.overlap else float("inf"))

    def describe(self, opt) -> str:
        c = self.cfg.compression
        return (f"compressor {c.compressor}, controller {self.state.controller!r}; as PyTorch "
                f"DDP's communication hook ("
                + (f"buckets of {c.bucket_cap_mb:g} MiB" if c.overlap else "one bucket")
                + ")" + ("" if c.exchange == "allgather" else f"; exchange {c.exchange}"))

    def step(self, opt, parameters, grad_clip):
        TorchDDP.step(self, opt, parameters, grad_clip)

    def begin_step(self, opt):
        self.state.restart_step_clock()

    def step_stats(self, opt, step, dense_numel):
        return self.state.last_stats

    def controller(self, opt):
        return self.state.controller


def build_method(cfg: Config, comm: Comm) -> Method:
    """The method ``cfg`` asks for on ``comm``'s transport (see the module docstring).

    Example::

        method = build_method(load_config(["configs/demo.yaml"]), gravac.comm.init("local"))
        method.kind                    # "gravac"
    """
    c = cfg.compression
    # Under horovodrun the hook would silently not exist: refused (the config refuses it
    # earlier wherever the launcher is known; here: run.backend=auto without a launcher,
    # e.g. --dry-run, where Horovod is what auto finds).
    refuse_ddp_only(c, comm.backend, hint="; to dry-run it in one process, "
                                          "--set run.backend=local")
    if c.controller == "dense":
        return _DENSE_BASELINES.get(comm.backend, Gravac)(cfg, comm)
    if c.front_end == "ddp_hook" and comm.backend == "torch":
        return GravacDDPHook(cfg, comm)
    return Gravac(cfg, comm)


#: What a user would run without gravac, by transport (others: gravac's dense path).
_DENSE_BASELINES = {"horovod": HorovodAllreduce, "torch": TorchDDP}


def _trained(opt) -> list[torch.Tensor]:
    """The parameters ``opt`` steps that take a gradient (what DDP's buckets hold)."""
    return [p for g in opt.param_groups for p in g["params"] if p.requires_grad]


def _value_bytes(opt) -> int:
    """Bytes of one gradient value of ``opt``'s parameters (4 for fp32)."""
    params = _trained(opt)
    return params[0].element_size() if params else 4


def _powersgd_hook_values(shape, rank: int, min_compression_rate: int = 2) -> int:
    """Values DDP's PowerSGD hook sends for one gradient of ``shape`` after its start:
    P (n x r) and Q (m x r) of its (shape[0], -1) view where that is at least
    ``min_compression_rate`` times smaller (the hook's ``_should_compress``), else the
    gradient whole.

    >>> _powersgd_hook_values((96, 32), 4), _powersgd_hook_values((10,), 4)
    (512, 10)
    """
    n, m = sizes.matrix_shape(shape)
    r = min(n, m, rank)
    return (n + m) * r if (n + m) * r * min_compression_rate < n * m else n * m
