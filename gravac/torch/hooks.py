"""gravac as a DDP communication hook: DDP, PyTorch Lightning and Accelerate users keep
their training loop and their optimizer; only how the gradients travel changes.

``GravacHookState`` holds the user's choices (compressor, controller, the engine's
options) apart from the internal state (error-feedback residuals keyed by parameter name,
the controller, the step count), as PyTorch's ``PowerSGDState`` does; ``gravac_hook`` is
the hook. Both drive the same step pipeline as ``gravac.torch.DistributedOptimizer``
(``gravac/engine/step.py``): DDP's buckets are handed to it as they become ready, each
leaves at once where its level is known before the gains (Static, Accordion, GraVAC with
``decide="previous"``, the dense, fp16 and sparse methods of ``Auto``), and DDP's last
bucket finishes the step (waits, writes the averages, tells the controller). So a static
CF gives bit for bit the parameters that ``gravac.torch.DistributedOptimizer`` gives.

Order of collectives: DDP launches its buckets strictly in bucket order (its reducer
never starts bucket i+1 before bucket i), its bucket layout is rank 0's on every rank,
and this hook issues every collective from the hook call itself (none from a future's
callback, which on gloo may run in a different order on each rank: the hazard
``gravac/torch/ddp.py`` describes for DDP's own PowerSGD hook). The futures it returns
complete when the last bucket's hook has finished the step. So every rank issues the same
collectives in the same order, including the controller's window broadcast, which runs in
the last bucket's hook.

What differs from the optimizer:

- the step's time (``t_iter``, which the controller's throughput table uses) runs from
  one step's last hook to the next; it includes the optimizer's update and whatever the
  loop does between steps (call ``restart_step_clock()`` after an evaluation);
- a step whose gradients hold a NaN or Inf on any rank cannot be skipped by the hook
  (the framework calls ``optimizer.step()``): every rank receives a non-finite gradient,
  as DDP's own allreduce would give, so AMP's ``GradScaler`` skips the step on every rank
  alike; the residuals are rolled back and ``max_consecutive_skips`` still applies
  (``nonfinite="raise"`` raises FloatingPointError from ``backward()`` on every rank);
- with ``find_unused_parameters=True``, a parameter this rank did not use is sent as zeros
  plus its residual (as the optimizer does); one that no rank used in a step keeps its
  gradient None (DDP's rule: the optimizer leaves it alone), so what error feedback sent
  for it in that step is dropped instead of applied;
- gradient accumulation is DDP's ``no_sync()``: the hook sees the accumulated gradient;
- ``overlap`` and ``backward_passes_per_step`` are DDP's business (refused here).

Example (torchrun; Lightning: ``DDPStrategy(ddp_comm_state=state, ddp_comm_hook=gravac_hook)``;
Accelerate: the same ``register_comm_hook`` on the model ``accelerator.prepare`` returns)::

    import torch, gravac
    from gravac.torch.hooks import GravacHookState, gravac_hook
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    state = GravacHookState(model, controller=gravac.controllers.Static(cf=100))
    ddp.register_comm_hook(state, gravac_hook)
    for x, y in loader:                      # the loop does not change
        opt.zero_grad(); loss_fn(ddp(x), y).backward(); opt.step()
    torch.save({"model": model.state_dict(), "hook": state.state_dict()}, "ckpt.pt")
"""

import math

import torch
import torch.distributed as dist

from .. import compressors as _compressors
from ..engine.layers import build_layers
from ..engine.optimizer import (STATE_FORMAT, STATE_KEY, _to_cpu, make_compression,
                                make_options)
from ..engine.record import StepStats
from ..engine.run_record import TENSORBOARD_TAGS
from ..engine.step import StepEngine

#: Options that DDP decides for the hook (its buckets overlap with backward already).
_DDP_OWNS = {"overlap": "DDP's buckets leave during backward already",
             "bucket_cap_mb": "set DDP's own bucket_cap_mb",
             "backward_passes_per_step": "accumulate with DDP's no_sync()"}


class GravacHookState:
    """The state of ``gravac_hook``: what to send (the user's choices) and what the hook
    keeps between steps (residuals, the controller, the step count).

    Arguments as ``gravac.torch.DistributedOptimizer``: ``model`` (the module DDP wraps,
    or the DDP model: parameters are named by ``model.named_parameters()`` and residuals
    keyed by those names), ``compressor``, ``controller``, ``compressor_options``,
    ``process_group`` (DDP's; default: the world), and the fields of
    ``gravac.engine.GravacOptions`` as keywords. ``optimizer`` (optional): the
    controller hears of its learning-rate decays (GraVAC and Accordion react to them).
    Nothing collective happens here: the engine is built, and the ranks agree on the
    set-up, in the first hook call, after the process group exists (Lightning builds the
    state before it starts the processes' group).

    After each step: ``last_stats`` (a ``gravac.engine.StepStats``), ``step_count``,
    ``scalars()`` for a logger. ``state_dict()`` / ``load_state_dict()`` carry the residuals,
    the controller and the step count (per rank, as the optimizer's); the state also
    pickles (without its process group and engine, rebuilt on first use) with the model
    and optimizer it watches: for another model, a new state and ``load_state_dict``.
    """

    def __init__(self, model: torch.nn.Module, compressor="topk", controller=None,
                 compressor_options: dict | None = None, process_group=None,
                 optimizer: torch.optim.Optimizer | None = None, **options):
        for name, why in _DDP_OWNS.items():
            if name in options:
                raise ValueError(f"{name}={options[name]!r}: not an option of the DDP hook "
                                 f"({why})")
        if not isinstance(model, torch.nn.Module):
            raise ValueError(f"model must be the torch.nn.Module that DDP wraps (or the DDP "
                             f"model), got {type(model).__name__}")
        # Checked here: unchecked, a wrong one fails deep in the first backward.
        if optimizer is not None and not isinstance(optimizer, torch.optim.Optimizer):
            raise ValueError(f"optimizer must be the torch.optim.Optimizer that steps the "
                             f"model (or None), got {type(optimizer).__name__}")
        if process_group is not None and not isinstance(process_group, dist.ProcessGroup):
            raise ValueError(f"process_group must be a torch.distributed ProcessGroup (or "
                             f"None: the default group), got {type(process_group).__name__}")
        # The user's choices, checked now (before any process starts training).
        self.options = make_options(options).check()
        self.compressor_name, self.compressor_options = compressor, dict(compressor_options or {})
        #: The controller (its state resumes from ``load_state_dict``).
        _, self.controller = make_compression(compressor, self.compressor_options, controller)
        self.process_group = process_group
        #: Parameters DDP was told to leave alone (given the DDP model): not gravac's either.
        self.ignored = sorted(getattr(model, "parameters_to_ignore", ()))
        # DDP's wrapper holds the model as .module; a model of the user's own may have an
        # attribute of that name too (a backbone), which is not the whole model.
        wrappers = (torch.nn.parallel.DistributedDataParallel, torch.nn.DataParallel)
        self.model = model.module if isinstance(model, wrappers) else model
        self.optimizer = optimizer
        self._reset_internal()

    def _reset_internal(self) -> None:
        self._engine: StepEngine | None = None
        self._layer_of: dict[int, object] = {}
        self._pending_state: dict | None = None
        self.step_count = 0
        self.last_stats: StepStats | None = None
        self._lrs: list[float] | None = None
        self._context: tuple[int, bool] | None = None
        self._last_end: float | None = None
        self._in_flight: list = []      # (future, bucket buffer) of the step's buckets
        self._swapped: list = []        # (parameter, its own .grad) while a step runs

    # -- what the engine owns --------------------------------------------------------------
    @property
    def engine(self) -> StepEngine:
        if self._engine is None:
            raise RuntimeError("the hook has not run yet: the engine is built at the first "
                               "backward of the DDP model")
        return self._engine

    memory = property(lambda self: self.engine.memory)

    def _bind(self) -> StepEngine:
        """Build the engine on DDP's process group and agree on the set-up (collective:
        the first hook call, the same on every rank)."""
        from ..comm.torchdist import TorchDistComm

        comp = _compressors.get(self.compressor_name, **self.compressor_options)
        named = [(n, p) for n, p in self.model.named_parameters() if n not in self.ignored]
        layers = build_layers([{"params": [p for _, p in named]}], named,
                              self.options.min_compress_numel, comp)
        engine = StepEngine(layers, comp, self.controller, TorchDistComm(self.process_group), self.options,
                            step_context=self._step_context, external_buckets=True)
        engine.agree(engine.describe_setup())
        self._layer_of = {id(l.param): l for l in layers}
        self._engine = engine
        if self._pending_state is not None:
            self._load_engine_state(self._pending_state)
            self._pending_state = None
        if self.optimizer is not None:
            self._lrs = _lrs(self.optimizer)
        return engine

    def _step_context(self) -> tuple[int, bool]:
        """(step, whether a learning rate went down since the last step), once per step."""
        if self._context is None:
            decayed = False
            if self.optimizer is not None:
                lrs = _lrs(self.optimizer)
                decayed = self._lrs is not None and any(n < o for n, o in zip(lrs, self._lrs))
                self._lrs = lrs
            self._context = (self.step_count, decayed)
        return self._context

    # -- the step --------------------------------------------------------------------------
    def run(self, bucket: dist.GradBucket) -> torch.futures.Future:
        """``gravac_hook``'s work: hand ``bucket`` to the engine; DDP's last bucket
        finishes the step."""
        engine = self._engine or self._bind()
        if bucket.buffer().is_sparse:
            raise ValueError("a DDP bucket holds a sparse gradient (an embedding with "
                             "sparse=True): gravac_hook takes dense gradients; use "
                             "sparse=False")
        layers = []
        for param, grad in zip(bucket.parameters(), bucket.gradients()):
            layer = self._layer_of.get(id(param))
            if layer is None:
                raise ValueError(f"DDP's bucket {bucket.index()} holds a parameter of shape "
                                 f"{tuple(param.shape)} that the hook state's model does not "
                                 "have: build GravacHookState on the module DDP wraps")
            # The engine reads and writes .grad: while the step runs it is DDP's view of
            # the bucket (the local gradient; zeros for a parameter unused on this rank),
            # so the averages land in the buffer DDP copies into the gradients, and the
            # parameter's own .grad (None when unused) is left as DDP expects.
            self._swapped.append((param, param.grad))
            param.grad = grad
            layers.append(layer)
        future = torch.futures.Future()
        self._in_flight.append((future, bucket.buffer()))
        try:
            engine.start_bucket(layers, bucket.is_last())
            if bucket.is_last():
                self._finish()
        except BaseException:
            self._abandon()
            raise
        return future

    def _finish(self) -> None:
        engine = self._engine
        step, decayed = self._step_context()
        t0 = engine.now()
        t_compute = None if self._last_end is None else t0 - self._last_end
        stats = engine.synchronize(step, decayed, t_compute)
        end = engine.now()
        # A skipped step is not skippable here: the engine made every gradient (DDP's
        # buckets) NaN on every rank, as DDP's allreduce would, and AMP's GradScaler skips
        # the update on every rank alike.
        if not stats.skipped and self._last_end is not None:
            stats.t_iter = end - self._last_end
        self._last_end = end
        engine.end_step(stats, samples=None if stats.skipped else
                        (self.options.batch_size or 1) * engine.comm.size)
        self.last_stats = stats
        self.step_count += 1
        self._context = None
        in_flight = self._in_flight
        self._restore_grads()
        for future, buffer in in_flight:
            future.set_result(buffer)

    def _restore_grads(self) -> None:
        for param, grad in self._swapped:
            param.grad = grad
        self._swapped, self._in_flight = [], []

    def _abandon(self) -> None:
        """A step that raised (on every rank alike: its causes are agreed): nothing of it
        stays behind."""
        self._restore_grads()
        self._context = None
        if self._engine is not None:
            self._engine.reset()

    def restart_step_clock(self) -> None:
        """Count the next step's time from now (after an evaluation, a checkpoint)."""
        if self._last_end is not None and self._engine is not None:
            self._last_end = self._engine.now()

    def on_epoch_end(self) -> None:
        """Tell the controller an epoch ended (Accordion's default interval)."""
        self.controller.on_epoch_end()

    def scalars(self) -> dict[str, float]:
        """The last step's numbers under the TensorBoard tags ``train.py`` writes (for
        ``self.log_dict`` in Lightning, ``accelerator.log``, a SummaryWriter)."""
        stats = self.last_stats
        if stats is None:
            return {}
        out = {}
        for tag, name in TENSORBOARD_TAGS.items():
            value = getattr(stats, name, None)
            if isinstance(value, (int, float)) and not isinstance(value, bool) \
                    and math.isfinite(value):
                out[tag] = float(value)
        return out

    # -- state -----------------------------------------------------------------------------
    def state_dict(self) -> dict:
        """This rank's residuals, the controller, the compressor's state and the step count
        (the format of the optimizer's ``state_dict()["gravac"]``)."""
        if self._engine is None:
            return dict(self._pending_state) if self._pending_state else \
                {"format": STATE_FORMAT, "step": self.step_count}
        return {"format": STATE_FORMAT, "step": self.step_count, **self._engine.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        """Resume: before the first backward (applied when the engine is built) or after."""
        if STATE_KEY in state and "format" not in state:
            raise ValueError(f"this is an optimizer's state dict (optimizer_with_hook_state): "
                             f"the hook's state is its {STATE_KEY!r} entry, or load the whole "
                             "of it into that optimizer")
        if state.get("format") != STATE_FORMAT:
            raise ValueError(f"gravac hook state has format {state.get('format')!r}; this "
                             f"version reads format {STATE_FORMAT}")
        self.step_count = int(state["step"])
        self._last_end, self._context = None, None
        if self._engine is None:
            self._pending_state = dict(state) if "memory" in state else None
        else:
            self._load_engine_state(state)

    def _load_engine_state(self, state: dict) -> None:
        self._engine.load_state_dict(state)
        if self.optimizer is not None:
            self._lrs = _lrs(self.optimizer)

    def __getstate__(self):
        # As PowerSGDState: no process group (and no engine, which holds it); the
        # residuals and the controller travel as a state dict, on the CPU.
        state = {k: v for k, v in self.__dict__.items() if not k.startswith("_")}
        state["process_group"] = None
        state["_pickled"] = _to_cpu(self.state_dict())
        return state

    def __setstate__(self, state):
        pickled = state.pop("_pickled")
        self.__dict__.update(state)
        self._reset_internal()
        self.load_state_dict(pickled)


def gravac_hook(state: GravacHookState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP communication hook: compress ``bucket``'s gradients with error feedback as
    ``state`` says, exchange them, and return the average (see the module docstring).

    Example::

        ddp.register_comm_hook(GravacHookState(model, controller=Static(cf=100)), gravac_hook)
    """
    return state.run(bucket)


class _HookStateInOptimizer:
    """Placed before the optimizer's class by ``optimizer_with_hook_state``."""

    def state_dict(self):
        state = super().state_dict()
        state[STATE_KEY] = self._gravac_hook_state.state_dict()
        return state

    def load_state_dict(self, state_dict):
        state_dict = dict(state_dict)
        hook_state = state_dict.pop(STATE_KEY, None)
        super().load_state_dict(state_dict)
        if hook_state is not None:
            self._gravac_hook_state.load_state_dict(hook_state)


def optimizer_with_hook_state(optimizer: torch.optim.Optimizer,
                              state: GravacHookState) -> torch.optim.Optimizer:
    """``optimizer``, whose ``state_dict()`` also holds ``state``'s (under ``"gravac"``, as
    gravac's own optimizer keeps its residuals) and whose ``load_state_dict`` gives it back:
    a framework that checkpoints the optimizer (Lightning, Accelerate, ``train.py``) then
    checkpoints the hook too. Returns the same object (its class gains the two methods).

    Example::

        opt = optimizer_with_hook_state(torch.optim.SGD(model.parameters(), lr=0.1), state)
        torch.save(opt.state_dict(), "opt.pt")     # residuals, controller, step count too
    """
    cls = optimizer.__class__
    if not issubclass(cls, _HookStateInOptimizer):
        optimizer.__class__ = type(cls.__name__, (_HookStateInOptimizer, cls), {})
    optimizer._gravac_hook_state = state
    return optimizer


def _lrs(optimizer) -> list[float]:
    return [float(g.get("lr", 0.0)) for g in optimizer.param_groups]
