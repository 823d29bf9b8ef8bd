"""The distributed optimizer over any ``Comm``: what both front ends return.

``wrap_optimizer(optimizer, named_parameters, comm, ...)`` returns an instance of a
subclass of the wrapped optimizer's class (as ``hvd.DistributedOptimizer`` does) whose
``step()`` first averages the gradients across ranks through a ``StepEngine``. The front
ends ``gravac.DistributedOptimizer`` (Horovod) and ``gravac.torch.DistributedOptimizer``
(torch.distributed) only build the ``Comm`` and call this.

Example::

    comm = gravac.comm.init("local")
    opt = wrap_optimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                         model.named_parameters(), comm, controller=Static(cf=100))
"""
from __future__ import annotations

import dataclasses
import sys
import warnings
from contextlib import contextmanager

import torch

from .. import compressors as _compressors
from ..comm import Comm
from ..controllers import Controller, Static
from ..memory import follow_devices
from .layers import build_layers
from .options import GravacOptions
from .record import StepStats
from .step import StepEngine

STATE_KEY = "gravac"
STATE_FORMAT = 1

# GradScaler warns, on every optimizer that takes ``grad_scaler=`` (ours: averaging first,
# then checking for an overflow on every rank alike), that it will stop passing itself.
# The contract it will move to gives the optimizer each rank's local verdict only.
warnings.filterwarnings("ignore", message="GradScaler is going to stop passing itself",
                        category=FutureWarning)


class DistributedOptimizerMixin:
    """Placed before the user's optimizer class: ``step()`` synchronises first.

    Attributes after each step: ``last_stats`` (a ``StepStats``), ``memory`` (residuals),
    ``controller``, ``compressor``, ``comm``, ``skipped_steps``, ``options``.
    """

    #: AMP's GradScaler hands itself to ``step(grad_scaler=...)`` instead of checking each
    #: rank's local, not yet averaged gradients for an overflow apart (which let one rank
    #: step, with collectives, while another skipped: a hang).
    _step_supports_amp_scaling = True

    def __init__(self, params, named_parameters, compressor, controller, comm: Comm,
                 options: GravacOptions, host_of_rank=None):
        super().__init__(params)
        options.check_with(compressor, controller)
        self.options = options
        self._prefix = options.name_prefix
        layers = build_layers(self.param_groups, named_parameters, options.min_compress_numel,
                              compressor)
        # Frozen when the optimizer was built: never communicated (a fine-tuned model's
        # frozen backbone costs nothing), so never unfrozen either (see synchronize).
        sent = {id(l.param) for l in layers}
        self._left_out = [p for g in self.param_groups for p in g["params"] if id(p) not in sent]
        self._context: tuple[int, bool] | None = None
        self._engine = StepEngine(layers, compressor, controller, comm, options, host_of_rank,
                                  step_context=self._step_context)
        self._agreed = False
        if not options.defer_agreement:
            self._agree()
        self.last_stats: StepStats | None = None
        self._gravac_step = 0
        self._last_step_end: float | None = None
        self._lrs = self._current_lrs()
        self._synchronized = False
        self._should_synchronize = True
        self._shared = False             # rank 0's shared state taken (the first step)

    # -- what the engine owns, for users and the trainer -----------------------------------
    compressor = property(lambda self: self._engine.compressor)
    controller = property(lambda self: self._engine.controller)
    memory = property(lambda self: self._engine.memory)
    comm = property(lambda self: self._engine.comm)
    skipped_steps = property(lambda self: self._engine.skipped_steps)
    min_compress_numel = property(lambda self: self.options.min_compress_numel)
    batch_size = property(lambda self: self.options.batch_size)
    nonfinite = property(lambda self: self.options.nonfinite)
    max_consecutive_skips = property(lambda self: self.options.max_consecutive_skips)

    @property
    def layer_names(self) -> list[str]:
        """Names of the parameters this optimizer communicates, in collective order."""
        return [l.name for l in self._engine.layers]

    @property
    def buckets(self) -> list[list[str]] | None:
        """With ``overlap=True``, the layer names of each bucket in the order they leave;
        None without overlap."""
        e = self._engine
        return None if e.hooks is None else [[l.name for l in b] for b in e.buckets]

    @property
    def compressed_layer_names(self) -> list[str]:
        return self._engine.compressed_layer_names

    @property
    def step_count(self) -> int:
        """Optimizer steps taken (skipped ones included); the controller's step clock."""
        return self._gravac_step

    def describe_setup(self) -> dict:
        """What every rank must agree on: compressor, controller, parameters, options."""
        return self._engine.describe_setup()

    def _agree(self) -> None:
        # Before anything else: ranks with different set-ups would issue different
        # collectives (a hang) or mix unrelated tensors. Raises on every rank alike.
        self._engine.agree(self.describe_setup())
        self._agreed = True

    def reset_world(self, comm: Comm) -> None:
        """Re-attach to a new set of ranks (an elastic reset). Collective.

        Call it on every rank, a joining one included, once the transport is up again
        (under ``hvd.elastic.run``: first thing in the function it wraps; build the
        optimizer with ``defer_agreement=True``): the set-up agreement runs again (a
        joining rank may have been built differently), the controller keeps what it
        learned but sees the new ranks, step timing restarts, and at the next step every
        rank takes rank 0's step count, controller and PowerSGD's Q. Residuals are left
        alone: each process keeps its own (a new process starts with none); the elastic
        trainer restores or clears them. A low-rank compressor's warm-start Q, which must
        be the same on every rank, becomes rank 0's.
        """
        self._engine.rebind(comm)
        self._agree()
        for comp in self._engine.compressors:
            if not comp.is_lowrank:
                continue
            # A joining process has no Q (or an older one): rank 0's, moved on first use.
            # (Pickled from the CPU: a GPU tensor would unpickle onto the sender's GPU.)
            state = comp.state_dict()
            state["q"] = {name: q.cpu() for name, q in state["q"].items()}
            state = comm.broadcast_object(state if comm.rank == 0 else None,
                                          name=f"{self._prefix}.lowrank.q")
            comp.load_state_dict(follow_devices(
                state, {l.name: l.param for l in self._engine.layers}))
        self._last_step_end = None
        self._synchronized = False
        self._should_synchronize = True
        self._context = None
        # Every rank calls this, so every rank takes rank 0's step count, controller and Q
        # at the next step, together: a joining worker's fresh optimizer (or one whose
        # state Horovod's TorchState synced without gravac's part) must not step on its
        # own step clock, whose windows would not line up with the others' (a hang).
        self._shared = False

    def add_param_group(self, param_group) -> None:
        """Refused once built: every rank's step sends the parameters the optimizer was
        built with (a group added on some ranks only would be a hang)."""
        if getattr(self, "_engine", None) is not None:
            raise ValueError("add_param_group: gravac's optimizer sends the parameters it was "
                             "built with; build the torch optimizer with every param group "
                             "first, then wrap it")
        super().add_param_group(param_group)

    def set_backward_passes_per_step(self, passes: int) -> None:
        """Horovod's: the backward passes accumulated per step from now on (with
        ``overlap=True``, the hooks send after the last of them). Call it on every rank."""
        options = dataclasses.replace(self.options, backward_passes_per_step=passes).check()
        if self._engine.active:
            raise RuntimeError("set_backward_passes_per_step: a step is in flight (backward "
                               "ran); call it between steps")
        self.options = self._engine.options = options
        if self._engine.hooks is not None:
            self._engine.hooks.backward_passes_per_step = passes
            self._engine.hooks.reset()

    @property
    def backward_passes_per_step(self) -> int:
        return self.options.backward_passes_per_step

    def restart_step_clock(self) -> None:
        """Count the next step's time from now: call it after work between two steps that
        is not training (evaluation, checkpoints, logging), so that the step's t_compute
        and t_iter, and the controller's throughput table, hold training time only
        (``train.py``'s loop calls it before every step). Before the first step, and
        after an elastic reset, there is no step time to restart: nothing changes.

        Example::

            opt.step()
            evaluate(model)
            opt.restart_step_clock()     # the evaluation is not in the next step's time
        """
        if self._last_step_end is not None:
            self._last_step_end = self._engine.now()

    def remove_hooks(self) -> None:
        """Detach the backward hooks of ``overlap=True`` (before wrapping the same model
        in another optimizer); ``step()`` then does the whole step itself."""
        if self._engine.active:
            raise RuntimeError("a step is in flight (backward ran): call step() first")
        self._engine.remove_hooks()

    @contextmanager
    def skip_synchronize(self):
        """Use after calling ``synchronize()`` yourself (e.g. to clip gradients)::

            optimizer.synchronize()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            with optimizer.skip_synchronize():
                optimizer.step()
        """
        self._should_synchronize = False
        try:
            yield
        finally:
            self._should_synchronize = True

    # -- the step -------------------------------------------------------------------------
    def _current_lrs(self) -> list[float]:
        return [float(g.get("lr", 0.0)) for g in self.param_groups]

    def _step_context(self) -> tuple[int, bool]:
        """(step, whether a learning rate went down since the last step): once per step,
        asked by ``synchronize`` or, with overlap, by the first gradient hook."""
        if self._context is None:
            comm = self._engine.comm
            if comm.live_size() != comm.size:
                # Horovod Elastic changed the ranks under this process: its collectives
                # would still be sized for the old world. (Re-attaching here would be
                # collective, which a rank that joined with a fresh optimizer would not
                # join: a hang; reset_world, called by every rank, is the way.)
                raise RuntimeError(
                    f"the Horovod world changed from {comm.size} to {comm.live_size()} "
                    "ranks (an elastic reset) and this optimizer still runs on the old "
                    "one: build it with defer_agreement=True and call "
                    "optimizer.reset_world(gravac.comm.horovod.HorovodComm()) first thing in "
                    "the function hvd.elastic.run wraps (docs/HOROVOD.md, Horovod Elastic)")
            if not self._agreed:
                self._agree()            # before the step's first collective
            if not self._shared:
                self._share_rank0_state()
            lrs = self._current_lrs()
            decayed = any(new < old for new, old in zip(lrs, self._lrs))
            self._lrs = lrs
            self._context = (self._gravac_step, decayed)
        return self._context

    def _reshare(self) -> None:
        """Take rank 0's step count, controller and PowerSGD's Q again at the next step
        (``_share_rank0_state``). For the broadcasts of the optimizer state, which every
        rank calls: rank 0 may have loaded a state alone, and ranks whose step clocks or
        controllers differ issue different collectives (a hang under Horovod, a collective
        mismatch under Gloo, seen when rank 0 reloaded a checkpoint mid-run)."""
        self._shared = False

    def _share_rank0_state(self) -> None:
        """Rank 0's step count, controller and PowerSGD's Q on every rank (collective, at
        the first step): what the ranks must share to issue the same collectives. A state
        loaded on rank 0 alone, as Horovod's examples resume (then
        ``hvd.broadcast_optimizer_state``, which knows nothing of gravac's state), would
        otherwise leave the ranks' step clocks and controllers apart: a hang at the next
        window. Residuals stay each rank's own."""
        e = self._engine
        lowrank = [c for c in e.compressors if c.is_lowrank]
        mine = None
        if e.comm.rank == 0:
            # (Pickled from the CPU: a GPU tensor would unpickle onto rank 0's GPU.)
            mine = {"step": self._gravac_step, "controller": _to_cpu(e.controller.state_dict()),
                    "lowrank": [_to_cpu(c.state_dict()) for c in lowrank]}
        shared = e.comm.broadcast_object(mine, name=f"{self._prefix}.shared_state")
        if e.comm.rank != 0:
            like = {l.name: l.param for l in e.layers}
            self._gravac_step = int(shared["step"])
            e.controller.load_state_dict(follow_devices(shared["controller"], like))
            for comp, state in zip(lowrank, shared["lowrank"]):
                comp.load_state_dict(follow_devices(state, like))
        self._shared = True

    def synchronize(self, *, _limit_skips: bool = True) -> None:
        """Compress, communicate and aggregate all gradients (``step()`` calls this). A
        step that some rank's NaN/Inf skips leaves every gradient NaN on every rank."""
        e = self._engine
        unfrozen = [p for p in self._left_out if p.grad is not None]
        if unfrozen:
            # Its gradient is this rank's alone: stepping on it would part the ranks.
            raise RuntimeError(
                f"{len(unfrozen)} parameter(s) (shapes {[tuple(p.shape) for p in unfrozen[:3]]}) "
                "have a gradient but were frozen (requires_grad=False) when gravac's optimizer "
                "was built, so they are not averaged; build the optimizer after unfreezing "
                "(a layer frozen later is handled: it sends zeros)")
        step, decayed = self._step_context()
        t0 = e.now()
        t_compute = None if self._last_step_end is None else t0 - self._last_step_end
        try:
            self.last_stats = e.synchronize(step, decayed, t_compute, limit_skips=_limit_skips)
        except BaseException:
            self._context = None         # a failed step (e.g. nonfinite='raise') is over
            raise
        self._synchronized = True

    def step(self, closure=None, grad_scaler=None):
        """Average the gradients (unless ``synchronize()`` did, see
        ``skip_synchronize``), then step the wrapped optimizer. ``grad_scaler``: AMP's
        ``GradScaler`` passes itself (``scaler.step(opt)``); the averaged gradients are then
        unscaled and checked for an overflow, the same on every rank, and a step that
        overflowed is skipped without counting toward ``max_consecutive_skips``."""
        if _horovod_initialising_state():
            return self._initialise_state(closure)
        if self._should_synchronize and not self._synchronized:
            self.synchronize(_limit_skips=grad_scaler is None)
        if not self._synchronized:
            # Inside skip_synchronize() without a synchronize(): a purely local step.
            if self._engine.active:
                raise RuntimeError("backward's hooks started this step's exchange "
                                   "(overlap=True): call synchronize() before step() inside "
                                   "skip_synchronize()")
            if grad_scaler is not None and not _unscaled_finite(grad_scaler, self):
                return None
            return super().step(closure)
        e, stats = self._engine, self.last_stats
        self._synchronized = False
        loss = None
        # Averaged (or NaN on every rank, when skipped): the same verdict on every rank,
        # which the scaler records for its update() in either case.
        finite = grad_scaler is None or _unscaled_finite(grad_scaler, self)
        update = finite and not stats.skipped
        if update:
            # Every rank agreed to skip a non-finite step: no update, residuals untouched,
            # the step still counts.
            t0 = e.now()
            loss = super().step(closure)
            end = e.now()                # (on a GPU, after the update's kernels finished)
            stats.t_update = end - t0
        else:
            end = e.now()
        if update and self._last_step_end is not None:
            stats.t_iter = end - self._last_step_end
        self._last_step_end = end
        e.end_step(stats, samples=None if not update else
                   (self.options.batch_size or 1) * e.comm.size)
        self._gravac_step += 1
        self._context = None
        return loss

    def _initialise_state(self, closure):
        """Horovod's ``broadcast_optimizer_state`` creates an empty state with a step on
        the zero gradients it set, on the ranks whose state is empty only (a collective
        there would hang): as for Horovod's own optimizer, the wrapped optimizer's step
        alone, and the parameters put back (weight decay would move them on those ranks
        only, after ``broadcast_parameters``)."""
        params = [p for g in self.param_groups for p in g["params"]]
        with torch.no_grad():
            saved = [p.detach().clone() for p in params]
        loss = super().step(closure)
        with torch.no_grad():
            for p, value in zip(params, saved):
                p.copy_(value)
        return loss

    # -- state ----------------------------------------------------------------------------
    def state_dict(self):
        """The wrapped optimizer's state plus this rank's residuals and the controller."""
        if _in_horovod_call("broadcast_optimizer_state"):
            # Every rank reads its state first there, after rank 0 may have loaded one
            # alone, mid-run too: rank 0's step, controller and Q are taken again.
            self._reshare()
        state = super().state_dict()
        state[STATE_KEY] = {"format": STATE_FORMAT, "step": self._gravac_step,
                            **self._engine.state_dict()}
        return state

    def load_state_dict(self, state_dict):
        """The wrapped optimizer's state (torch moves it onto the parameters' devices) and
        gravac's: residuals, PowerSGD's Q and the controller's per-layer tensors also move
        to their parameters' devices (and residuals to their dtypes), so a checkpoint
        saved on a GPU resumes on a CPU, and one read with ``map_location="cpu"`` on a GPU."""
        if "param_groups" not in state_dict and "format" in state_dict:
            # torch's own KeyError 'param_groups' named neither what was given nor the way
            raise ValueError("this is gravac's state alone (a GravacHookState's state_dict(), "
                             f"or an optimizer state's {STATE_KEY!r} entry): load it into a "
                             "GravacHookState, or give this optimizer a whole optimizer state "
                             f"dict, with it as its {STATE_KEY!r} entry")
        state_dict = dict(state_dict)
        extra = state_dict.pop(STATE_KEY, None)
        super().load_state_dict(state_dict)
        if extra is not None:
            if extra.get("format") != STATE_FORMAT:
                raise ValueError(f"gravac optimizer state has format {extra.get('format')!r}; "
                                 f"this version reads format {STATE_FORMAT}")
            self._engine.load_state_dict(extra)
            self._gravac_step = int(extra["step"])
        self._synchronized = False
        self._lrs = self._current_lrs()
        self._context = None


def _horovod_initialising_state() -> bool:
    """Whether ``step()`` was called by Horovod's ``broadcast_optimizer_state`` (to create
    an empty state). Horovod tells its own optimizer by its module, which gravac's is not."""
    return _in_horovod_call("broadcast_optimizer_state")


def _in_horovod_call(function: str) -> bool:
    """Whether Horovod's ``function`` is among the few callers of the caller (a few frames
    up covers torch's wrappers around ``step``)."""
    frame = sys._getframe(2)
    for _ in range(7):
        if frame is None:
            return False
        if frame.f_code.co_name == function and \
                frame.f_globals.get("__name__", "").startswith("horovod."):
            return True
        frame = frame.f_back
    return False


def _unscaled_finite(scaler, optimizer) -> bool:
    """Unscale ``optimizer``'s gradients by AMP's ``scaler`` (unless ``scaler.unscale_``
    ran already this step) and say whether they are finite, as ``GradScaler.step`` would
    on an optimizer without its own scaling. The scaler records the verdict for its
    ``update()`` in its per-optimizer state, which ``GradScaler.step`` reads the same way."""
    state = scaler._per_optimizer_states[id(optimizer)]
    if state["stage"].name == "READY":
        scaler.unscale_(optimizer)
    return not sum(float(v) for v in state["found_inf_per_device"].values())


def _make_controller(controller) -> Controller:
    if controller is None:
        return Static(cf=100)
    if isinstance(controller, Controller):
        return controller
    if isinstance(controller, (int, float)) and not isinstance(controller, bool):
        return Static(cf=controller)
    raise ValueError(f"controller must be a gravac.controllers.Controller (e.g. Static(cf=100), "
                     f"GraVAC(...)) or a number (a static CF), got {controller!r}")


def make_compression(compressor, compressor_options: dict | None, controller):
    """(compressor, controller) as the front ends take them (a name and its options, a
    Controller or a number), refusing a controller that plans PowerSGD ranks for a
    sparsifier."""
    comp = _compressors.get(compressor, **(compressor_options or {}))
    ctrl = _make_controller(controller)
    if ctrl.uses_ranks and not comp.is_lowrank:
        raise ValueError(f"controller {ctrl!r} plans PowerSGD ranks, which only "
                         f"compressor='powersgd' takes (got {comp.name!r}); sparsifiers take "
                         "CFs, e.g. Static(cf=100)")
    return comp, ctrl


def make_options(options: dict) -> GravacOptions:
    """``GravacOptions`` from keyword arguments, refusing a name it does not have."""
    known = [f.name for f in dataclasses.fields(GravacOptions)]
    unknown = sorted(set(options) - set(known))
    if unknown:
        raise ValueError(f"unknown option {unknown[0]!r}; gravac's options are "
                         f"{', '.join(known)} (gravac.engine.GravacOptions)")
    return GravacOptions(**options)


def wrap_optimizer(optimizer, named_parameters, comm: Comm, compressor="topk", controller=None,
                   compressor_options: dict | None = None, host_of_rank=None, **options):
    """The distributed form of ``optimizer`` over ``comm`` (see the front ends' docstrings
    for the arguments: ``gravac.DistributedOptimizer``); ``options`` are the fields of
    ``GravacOptions``. ``host_of_rank`` (hierarchical exchange only): every rank's host,
    when the launcher's numbering (``comm.node``) is not the layout wanted."""
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise ValueError(f"optimizer must be a torch.optim.Optimizer, got {type(optimizer).__name__}")
    if isinstance(optimizer, DistributedOptimizerMixin):
        raise ValueError("optimizer is already a gravac DistributedOptimizer: wrap the torch "
                         "optimizer once")
    if type(optimizer).__dict__.get("_allreduce_grad_async") is not None:
        # Horovod's wrapper (a class made per optimizer, holding _DistributedOptimizer's
        # methods): the script's hvd.DistributedOptimizer line was kept beside gravac's.
        raise ValueError("optimizer is a hvd.DistributedOptimizer: pass the torch optimizer "
                         "it wraps (gravac's replaces Horovod's, not wraps it)")
    if not isinstance(comm, Comm):
        raise ValueError(f"comm must be a gravac.comm.Comm (e.g. gravac.comm.init('auto')), "
                         f"got {type(comm).__name__}")
    opts = make_options(options).check()
    comp, ctrl = make_compression(compressor, compressor_options, controller)
    cls = type(optimizer.__class__.__name__, (DistributedOptimizerMixin, optimizer.__class__), {})
    return cls(optimizer.param_groups, named_parameters, comp, ctrl, comm, opts, host_of_rank)


def broadcast_optimizer_state(optimizer, comm: Comm, root: int = 0) -> None:
    """Give every rank ``root``'s optimizer state (momentum, ...) over any ``Comm``, as
    Horovod's ``broadcast_optimizer_state``. Residuals stay each rank's own; the step
    count, the controller and PowerSGD's Q, which decide the collectives, are rank 0's on
    every rank from the next step (as after Horovod's broadcast).

    Example::

        broadcast_optimizer_state(opt, comm)       # after loading a state on rank 0 only
    """
    state = optimizer.state_dict()
    state.pop(STATE_KEY, None)
    # Pickled from the CPU: a GPU tensor would unpickle onto the root's GPU on every rank.
    # load_state_dict moves the state onto each rank's parameters' devices.
    shared = comm.broadcast_object(_to_cpu(state) if comm.rank == root else None,
                                   name="gravac.optimizer_state", root=root)
    if comm.rank != root:
        mine = optimizer.state_dict()
        if STATE_KEY in mine:
            shared[STATE_KEY] = mine[STATE_KEY]
        optimizer.load_state_dict(shared)
    if isinstance(optimizer, DistributedOptimizerMixin):
        optimizer._reshare()


def _to_cpu(obj):
    """``obj`` (nested dicts, lists, tuples) with every tensor copied to the CPU."""
    if isinstance(obj, torch.Tensor):
        return obj.cpu()
    if isinstance(obj, dict):
        return {key: _to_cpu(value) for key, value in obj.items()}
    if isinstance(obj, (list, tuple)) and type(obj) in (list, tuple):
        return type(obj)(_to_cpu(v) for v in obj)
    return obj
