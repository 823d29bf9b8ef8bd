"""gravac.DistributedOptimizer: sparse allgather with error feedback, on Horovod.

Per step, for every parameter that has a gradient: layers of at least
``min_compress_numel`` elements are error-fed (g_ef = grad + residual) and sparsified to
the controller's CF (optionally a second, candidate level over the kept values); all
sparse layers travel in ONE fused allgather and all dense ones in ONE grouped allreduce
(average); residuals keep what was not sent; then the wrapped optimizer steps.

Collectives are named deterministically and issued in the same order on every rank, and
the choice of what is sent (which selects the collectives) comes from the controller,
which decides from values agreed across ranks. No rank decides alone.
"""
from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass

import horovod.torch as hvd
import torch

from .. import compressors as _compressors
from ..compressors import SelectContext, num_kept
from ..controllers import SENT_CANDIDATE, SENT_DENSE, SENT_MIN, Controller, Static, StepRecord
from ..memory import ResidualMemory, SparseSent
from .agreement import check_agreement
from .compression import SparseCompression, SparseLayer
from .sync import HorovodSync

SENT_SKIPPED = "skipped"
STATE_KEY = "gravac"
STATE_FORMAT = 1


@dataclass
class _Layer:
    index: int
    name: str
    param: torch.Tensor
    numel: int
    compressible: bool


@dataclass
class _Selection:
    layer: _Layer
    g_ef: torch.Tensor
    idx_min: torch.Tensor
    val_min: torch.Tensor
    idx_c: torch.Tensor | None = None
    val_c: torch.Tensor | None = None


def _named_layers(param_groups, named_parameters, min_compress_numel, compressor) -> list[_Layer]:
    """Validate names and build the layer list in param-group order (same on all ranks)."""
    if named_parameters is None:
        raise ValueError("named_parameters is required: pass model.named_parameters(); names key "
                         "the residual memory and must be the same on every rank")
    named = list(named_parameters)
    for item in named:
        if not (isinstance(item, tuple) and len(item) == 2):
            raise ValueError("named_parameters must be a sequence of (name, parameter) tuples, "
                             "usually model.named_parameters()")
    for name, _ in named:
        if not isinstance(name, str) or not name:
            raise ValueError(f"every parameter needs a non-empty string name, got {name!r}; "
                             "use model.named_parameters() or name each parameter")
    seen, dups = set(), set()
    for name, _ in named:
        (dups if name in seen else seen).add(name)
    if dups:
        raise ValueError(f"parameter names must be unique; duplicated: {', '.join(sorted(dups))}")
    names_by_id = {id(p): name for name, p in named}
    layers, unnamed = [], []
    for group in param_groups:
        for p in group["params"]:
            if id(p) not in names_by_id:
                unnamed.append(tuple(p.shape))
                continue
            if not p.requires_grad:
                continue  # frozen: never has a gradient, never communicated
            compressible = (not compressor.is_dense and p.numel() >= min_compress_numel
                            and p.is_floating_point())
            layers.append(_Layer(len(layers), names_by_id[id(p)], p, p.numel(), compressible))
    if unnamed:
        raise ValueError(f"{len(unnamed)} optimizer parameter(s) have no name in named_parameters "
                         f"(shapes {unnamed[:5]}); pass named_parameters covering every parameter "
                         "the optimizer updates")
    return layers


class _DistributedOptimizer(torch.optim.Optimizer):
    def __init__(self, params, named_parameters, compressor, controller, min_compress_numel,
                 batch_size, process_set, name_prefix, nonfinite, max_consecutive_skips,
                 defer_agreement):
        super(self.__class__, self).__init__(params)
        if isinstance(min_compress_numel, bool) or not isinstance(min_compress_numel, int) \
                or min_compress_numel < 1:
            raise ValueError(f"min_compress_numel must be an int >= 1, got {min_compress_numel!r}")
        if batch_size is not None and not (isinstance(batch_size, int) and batch_size > 0):
            raise ValueError(f"batch_size must be a positive int (samples per rank per step) "
                             f"or None, got {batch_size!r}")
        if nonfinite not in ("skip", "raise"):
            raise ValueError(f"nonfinite must be 'skip' (skip the step on every rank) or 'raise' "
                             f"(stop), got {nonfinite!r}")
        if isinstance(max_consecutive_skips, bool) or not isinstance(max_consecutive_skips, int) \
                or max_consecutive_skips < 0:
            raise ValueError(f"max_consecutive_skips must be an int >= 0, got "
                             f"{max_consecutive_skips!r}")
        self.nonfinite = nonfinite
        self.max_consecutive_skips = max_consecutive_skips
        self._consecutive_skips = 0
        self.skipped_steps: list[dict] = []
        self.compressor = compressor
        self.controller = controller
        self.min_compress_numel = min_compress_numel
        self.batch_size = batch_size
        self.process_set = process_set
        self._prefix = name_prefix
        self._layers = _named_layers(self.param_groups, named_parameters, min_compress_numel,
                                     compressor)
        self._sync = HorovodSync(process_set)
        self._agreed = False
        if not defer_agreement:
            self._agree()
        self.memory = ResidualMemory()
        self.controller.bind([l.name for l in self._layers if l.compressible], self._sync)
        self.last_stats: dict = {}
        self._gravac_step = 0
        self._last_step_end: float | None = None
        self._lrs = self._current_lrs()
        self._synchronized = False
        self._should_synchronize = True
        self._codecs: dict[tuple[str, ...], SparseCompression] = {}
        # CUDA kernels run asynchronously: time phases only after the device has finished.
        self._cuda = any(l.param.is_cuda for l in self._layers)

    def _agree(self) -> None:
        # Before anything else: ranks with different set-ups would issue different
        # collectives (a hang) or mix unrelated tensors. Raises on every rank alike.
        check_agreement(self.describe_setup(), self.process_set, name=f"{self._prefix}.agree")
        self._agreed = True

    def reset_world(self) -> None:
        """Re-attach to Horovod after an elastic reset (ranks left or joined). Collective.

        Call it on every rank once ``hvd.init()`` has run again and the training state is
        in sync: the set-up agreement runs again (a joining rank may have been built
        differently), the controller keeps what it learned but sees the new ranks, and
        step timing restarts. Residuals are left alone: each process keeps its own (a new
        process starts with none); the elastic trainer restores or clears them.
        """
        self._sync = HorovodSync(self.process_set)
        self._agree()
        self.controller.rebind(self.compressed_layer_names, self._sync)
        self._last_step_end = None
        self._synchronized = False
        self._should_synchronize = True

    # -- public helpers -------------------------------------------------------------------
    @property
    def layer_names(self) -> list[str]:
        """Names of the parameters this optimizer communicates, in collective order."""
        return [l.name for l in self._layers]

    def describe_setup(self) -> dict:
        """What every rank must agree on: compressor, controller, parameters, options."""
        return {
            "compressor": self.compressor.describe(),
            "controller": self.controller.describe(),
            "min_compress_numel": self.min_compress_numel,
            "name_prefix": self._prefix,
            "nonfinite": self.nonfinite,
            "max_consecutive_skips": self.max_consecutive_skips,
            "parameters": [f"{l.name} {tuple(l.param.shape)} {l.param.dtype}"
                           f"{' compressed' if l.compressible else ''}" for l in self._layers],
        }

    @property
    def compressed_layer_names(self) -> list[str]:
        return [l.name for l in self._layers if l.compressible]

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

    def _codec(self, layers: list[_Layer]) -> SparseCompression:
        key = tuple(l.name for l in layers)
        codec = self._codecs.get(key)
        if codec is None:
            specs = [SparseLayer(l.name, l.numel, ResidualMemory.dtype_for(l.param.grad.dtype))
                     for l in layers]
            codec = SparseCompression(specs, device=layers[0].param.device)
            self._codecs[key] = codec
        return codec

    def _select(self, layer: _Layer, g_ef: torch.Tensor, cf: float, theta_c: float | None,
                step: int) -> _Selection:
        rank = self._sync.rank
        k_min = num_kept(layer.numel, cf)
        idx_min = self.compressor.select(g_ef, k_min, SelectContext(step, layer.index, rank, 0))
        val_min = g_ef[idx_min]
        sel = _Selection(layer, g_ef, idx_min, val_min)
        if theta_c is not None and theta_c > cf:
            # Multi-level: the second pass sees the k_min kept values, not the n entries;
            # its k is the one a direct compression at θc would use.
            k_c = num_kept(layer.numel, theta_c)
            sub = self.compressor.select(val_min, k_c, SelectContext(step, layer.index, rank, 1))
            sel.idx_c, sel.val_c = idx_min[sub], val_min[sub]
        return sel

    def _agree_gains(self, selections: list[_Selection], step: int):
        """Whole-model compression gains, summed over ranks with one tiny allreduce."""
        if selections:
            # Summed on the gradients' device and moved once: one sync, not one per layer.
            sq = torch.stack([
                torch.stack([_sq_norm(s.val_min),
                             _sq_norm(s.val_c if s.val_c is not None else s.val_min),
                             _sq_norm(s.g_ef)])
                for s in selections]).double().sum(0).cpu()
        else:
            sq = torch.zeros(3, dtype=torch.float64)
        sq = hvd.allreduce(sq, op=hvd.Sum, name=f"{self._prefix}.gains",
                           process_set=self.process_set)
        total = float(sq[2])
        if total <= 0.0:
            return 1.0, 1.0
        return float(sq[0]) / total, float(sq[1]) / total

    def _now(self) -> float:
        if self._cuda:
            torch.cuda.synchronize()
        return time.perf_counter()

    def _nonfinite_ranks(self) -> list[int]:
        """Ranks whose gradient has a NaN or Inf this step, agreed by one tiny allreduce.

        Checked before error feedback touches the residuals, so a skipped step leaves them
        as they were. A float64 sum is finite exactly when no entry is NaN or Inf.
        """
        grads = [l.param.grad for l in self._layers]
        local = torch.stack([g.sum(dtype=torch.float64) for g in grads]).sum() if grads else None
        flags = torch.zeros(self._sync.size, dtype=torch.float64)
        if local is not None and not bool(torch.isfinite(local)):
            flags[self._sync.rank] = 1.0
        flags = hvd.allreduce(flags, op=hvd.Sum, name=f"{self._prefix}.finite",
                              process_set=self.process_set)
        return [r for r, f in enumerate(flags.tolist()) if f > 0]

    def _skip(self, step: int, bad_ranks: list[int], t0: float, t_compute) -> None:
        self._consecutive_skips += 1
        event = {"step": step, "ranks": bad_ranks}
        self.skipped_steps.append(event)
        if self.nonfinite == "raise" or self._consecutive_skips > self.max_consecutive_skips:
            why = ("nonfinite='raise'" if self.nonfinite == "raise" else
                   f"{self._consecutive_skips} consecutive steps skipped (max_consecutive_skips="
                   f"{self.max_consecutive_skips})")
            raise FloatingPointError(
                f"non-finite gradient (NaN or Inf) at step {step} on rank(s) "
                f"{', '.join(map(str, bad_ranks))}; stopping: {why}. Lower the learning rate, "
                "clip gradients (optimizer.grad_clip) or check the data of those ranks.")
        total = sum(l.numel for l in self._layers)
        self.last_stats = {"step": step, "sent": SENT_SKIPPED, "cf": 1.0,
                           "nonfinite_ranks": bad_ranks, "theta_min": None, "theta_c": None, "gain_min": None, "gain_c": None,
                           "values_sent": 0, "floats_sent": 0, "dense_floats": total,
                           "bytes_sent": 0, "sparse_layers": 0, "dense_layers": 0,
                           "t_compute": t_compute, "t_compress": self._now() - t0, "t_comm": 0.0,
                           "t_update": 0.0, "t_iter": None}
        self._synchronized = True

    def synchronize(self):
        """Compress, communicate and aggregate all gradients (``step()`` calls this)."""
        if not self._agreed:
            self._agree()
        t0 = self._now()
        step = self._gravac_step
        t_compute = None if self._last_step_end is None else t0 - self._last_step_end
        # A learning-rate decay (seen in the param groups, which every rank shares) must
        # reach the controller before it plans the step that uses the new rate.
        lrs = self._current_lrs()
        if any(new < old for new, old in zip(lrs, self._lrs)):
            self.controller.on_lr_decay()
        self._lrs = lrs
        plan = self.controller.plan(step)

        for layer in self._layers:
            grad = layer.param.grad
            if grad is None:
                # Every rank must send every layer (another rank may have a gradient for it).
                layer.param.grad = torch.zeros_like(layer.param)
            elif grad.is_sparse:
                # Sparse embedding gradients: compressed or averaged like any other layer
                # (the optimizer then sees a dense gradient, as with sparse_as_dense).
                layer.param.grad = grad.to_dense()
        bad_ranks = self._nonfinite_ranks()
        if bad_ranks:
            self._skip(step, bad_ranks, t0, t_compute)
            return
        if self.controller.wants_gradients:
            self.controller.observe_gradients(
                {l.name: l.param.grad for l in self._layers if l.compressible})

        dense = [l for l in self._layers if not l.compressible]
        selections: list[_Selection] = []
        for layer in self._layers:
            if not layer.compressible:
                continue
            cf = plan.cf_of(layer.name)
            if cf <= 1:
                # Planned dense: the gradient absorbs the residual (free when it is already
                # zero, e.g. GraVAC settled on dense on a fast link: no extra passes).
                self.memory.flush_into(layer.name, layer.param.grad)
                dense.append(layer)
                continue
            g_ef = self.memory.compensate(layer.name, layer.param.grad)
            selections.append(self._select(layer, g_ef, cf, plan.theta_c, step))

        gain_min = gain_c = None
        if plan.needs_gains:
            gain_min, gain_c = self._agree_gains(selections, step)
            if not any(s.val_c is not None for s in selections):
                gain_c = None
        sent = self.controller.decide(gain_min, gain_c) if selections else SENT_MIN
        if sent not in (SENT_CANDIDATE, SENT_MIN, SENT_DENSE):
            raise RuntimeError(f"controller returned {sent!r}; expected one of "
                               f"{SENT_CANDIDATE!r}, {SENT_MIN!r}, {SENT_DENSE!r}")
        if sent == SENT_CANDIDATE and any(s.val_c is None for s in selections):
            raise RuntimeError("controller chose the candidate but its plan had no candidate CF "
                               "above theta_min")

        packed = []
        if sent == SENT_DENSE:
            for s in selections:
                s.layer.param.grad.view(-1).copy_(s.g_ef)
                self.memory.update(s.layer.name, s.g_ef, None)
                dense.append(s.layer)
            selections = []
        else:
            for s in selections:
                idx, val = (s.idx_c, s.val_c) if sent == SENT_CANDIDATE else (s.idx_min, s.val_min)
                packed.append((val, idx))
                # val is a copy (gathered), so g_ef's buffer may now become the residual.
                self.memory.update(s.layer.name, s.g_ef, SparseSent(idx, val))

        buffer = codec = ctx = None
        if selections:
            codec = self._codec([s.layer for s in selections])
            buffer, ctx = codec.compress(packed)
        t1 = self._now()

        # One fused allgather for sparse layers, one grouped allreduce for dense ones.
        gather_handle = reduce_handle = None
        if buffer is not None:
            gather_handle = hvd.allgather_async(buffer, name=f"{self._prefix}.sparse",
                                                process_set=self.process_set)
        dense.sort(key=lambda l: l.index)
        # Horovod's torch binding has no bfloat16: such gradients travel as float32 copies.
        wire = [l.param.grad if l.param.grad.dtype != torch.bfloat16 else l.param.grad.float()
                for l in dense]
        if dense:
            reduce_handle = hvd.grouped_allreduce_async_(
                wire, op=hvd.Average, name=f"{self._prefix}.dense",
                process_set=self.process_set)
        gathered = hvd.synchronize(gather_handle) if gather_handle is not None else None
        if reduce_handle is not None:
            hvd.synchronize(reduce_handle)
            for layer, averaged in zip(dense, wire):
                if averaged is not layer.param.grad:
                    layer.param.grad.copy_(averaged)
        t2 = self._now()

        if gathered is not None:
            flat = codec.decompress(gathered, ctx, world_size=self._sync.size)
            for s, part in zip(selections, codec.split(flat, ctx)):
                s.layer.param.grad.view(-1).copy_(part)
        t3 = self._now()

        kept = sum(int(v.numel()) for v, _ in packed)
        dense_numel = sum(l.numel for l in dense)
        total_numel = sum(l.numel for l in self._layers)
        if not selections:
            sent, cf_sent = SENT_DENSE, 1.0   # nothing went sparse this step
        elif sent == SENT_DENSE:
            cf_sent = 1.0
        elif sent == SENT_CANDIDATE:
            cf_sent = float(plan.theta_c)
        else:
            cf_sent = float(plan.theta_min) if plan.layer_cf is None else (
                _effective_cf(sum(s.layer.numel for s in selections), kept))
        self.last_stats = {
            "step": step,
            "sent": sent,
            "cf": cf_sent,
            "theta_min": float(plan.theta_min),
            "theta_c": None if plan.theta_c is None else float(plan.theta_c),
            "gain_min": gain_min,
            "gain_c": gain_c,
            "sparse_layers": len(selections),
            "dense_layers": len(dense),
            "values_sent": kept,
            # Values and indices each count as one float (as the paper counts), plus dense.
            "floats_sent": 2 * kept + dense_numel,
            "dense_floats": total_numel,
            "bytes_sent": (0 if buffer is None else buffer.numel())
                          + sum(w.numel() * w.element_size() for w in wire),
            "t_compute": t_compute,
            "t_compress": (t1 - t0) + (t3 - t2),
            "t_comm": t2 - t1,
        }
        if plan.layer_cf is not None:
            self.last_stats["layer_cf"] = dict(plan.layer_cf)
        self._consecutive_skips = 0
        self._synchronized = True

    def step(self, closure=None):
        if self._should_synchronize and not self._synchronized:
            self.synchronize()
        if not self._synchronized:
            # Inside skip_synchronize() without a synchronize(): a purely local step.
            return super(self.__class__, self).step(closure)
        if self.last_stats.get("sent") == SENT_SKIPPED:
            # Every rank agreed to skip: no update, residuals untouched, the step counts.
            self._synchronized = False
            self._last_step_end = self._now()
            self.controller.end_step(StepRecord(step=self.last_stats["step"], sent=SENT_SKIPPED,
                                                cf=1.0, gain=1.0, t_iter=None), self._sync)
            self._gravac_step += 1
            return None
        t0 = self._now()
        loss = super(self.__class__, self).step(closure)
        t1 = self._now()
        self._synchronized = False
        stats = self.last_stats
        stats["t_update"] = t1 - t0
        stats["t_iter"] = None if self._last_step_end is None else t1 - self._last_step_end
        self._last_step_end = t1

        samples = (self.batch_size or 1) * self._sync.size
        gain = {SENT_CANDIDATE: stats["gain_c"], SENT_MIN: stats["gain_min"]}.get(stats["sent"], 1.0)
        self.controller.end_step(
            StepRecord(step=stats["step"], sent=stats["sent"], cf=stats["cf"],
                       gain=1.0 if gain is None else gain, t_iter=stats["t_iter"],
                       samples=samples),
            self._sync)
        self._gravac_step += 1
        return loss

    # -- state ----------------------------------------------------------------------------
    def state_dict(self):
        """The wrapped optimizer's state plus this rank's residuals and the controller."""
        state = super(self.__class__, self).state_dict()
        state[STATE_KEY] = {
            "format": STATE_FORMAT,
            "step": self._gravac_step,
            "memory": self.memory.state_dict(),
            "controller": self.controller.state_dict(),
            "compressor": self.compressor.state_dict(),
        }
        return state

    def load_state_dict(self, state_dict):
        state_dict = dict(state_dict)
        extra = state_dict.pop(STATE_KEY, None)
        super(self.__class__, self).load_state_dict(state_dict)
        if extra is not None:
            if extra.get("format") != STATE_FORMAT:
                raise ValueError(f"gravac optimizer state has format {extra.get('format')!r}; "
                                 f"this version reads format {STATE_FORMAT}")
            self.memory.load_state_dict(extra["memory"])
            self.controller.load_state_dict(extra["controller"])
            self.compressor.load_state_dict(extra.get("compressor", {}))
            self._gravac_step = int(extra["step"])
        self._synchronized = False
        self._lrs = self._current_lrs()


def _sq_norm(t: torch.Tensor) -> torch.Tensor:
    t = t.reshape(-1)
    if t.dtype != torch.float32 and t.dtype != torch.float64:
        t = t.float()
    return torch.dot(t, t)


def _effective_cf(numel: int, kept: int) -> float:
    return float(numel) / kept if kept else 1.0


def _make_controller(controller) -> Controller:
    if controller is None:
        return Static(cf=100)
    if isinstance(controller, Controller):
        return controller
    if isinstance(controller, (int, float)) and not isinstance(controller, bool):
        return Static(cf=controller)
    raise ValueError(f"controller must be a gravac.controllers.Controller (e.g. Static(cf=100), "
                     f"GraVAC(...)) or a number (a static CF), got {controller!r}")


def DistributedOptimizer(optimizer, named_parameters, compressor="topk", controller=None,
                         min_compress_numel: int = 1024, compressor_options: dict | None = None,
                         batch_size: int | None = None, process_set=None,
                         name_prefix: str = "gravac", nonfinite: str = "skip",
                         max_consecutive_skips: int = 10, defer_agreement: bool = False):
    """Wrap a torch optimizer so that ``step()`` averages gradients across Horovod ranks
    with compressed (sparse) communication and error feedback.

    Like ``hvd.DistributedOptimizer``, the returned object is an instance of a subclass of
    the wrapped optimizer's class, built from its param groups (its state is not copied:
    wrap it before training or load a state dict afterwards).

    Args:
        optimizer: any ``torch.optim.Optimizer``.
        named_parameters: ``model.named_parameters()``; every parameter of the optimizer
            needs a unique name (names key the residual memory and must match across ranks).
        compressor: ``"topk"``, ``"dgc"``, ``"redsync"``, ``"randomk"``, ``"none"`` or a
            ``gravac.compressors.Compressor`` instance.
        controller: decides the CF: ``gravac.controllers.Static(cf=100)`` (default),
            ``GraVAC(...)``, ``Accordion(...)``, or a number for a static CF.
        min_compress_numel: parameters with fewer elements (biases, norms) are sent dense.
        compressor_options: keyword options of the named compressor.
        batch_size: samples per rank per step, used for throughput (samples/s) statistics.
        process_set: Horovod process set (default: all ranks).
        name_prefix: prefix of the collectives' names; give two wrapped optimizers that
            step concurrently different prefixes.
        nonfinite: what a NaN/Inf gradient on any rank does (detected collectively before
            the residuals are touched): ``"skip"`` the step on every rank, or ``"raise"``
            FloatingPointError on every rank. Skipped steps are listed in ``skipped_steps``.
        max_consecutive_skips: with ``"skip"``, raise after this many skips in a row.
        defer_agreement: run the set-up agreement (a collective) at the first step or
            ``reset_world()`` instead of here. Horovod Elastic needs it: a joining worker
            builds its optimizer while the others wait in a state sync, so construction
            must issue no collective.

    After each ``step()``, ``optimizer.last_stats`` describes it (CF sent, gains, floats
    sent, timings) and ``optimizer.memory[name]`` is the residual of a parameter.

    Example::

        import horovod.torch as hvd, gravac
        hvd.init()
        model = Net()
        opt = torch.optim.SGD(model.parameters(), lr=0.1 * hvd.size(), momentum=0.9)
        opt = gravac.DistributedOptimizer(opt, model.named_parameters(), compressor="topk",
                                          controller=gravac.controllers.Static(cf=100))
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        hvd.broadcast_optimizer_state(opt, root_rank=0)
        for x, y in loader:
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
    """
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise ValueError(f"optimizer must be a torch.optim.Optimizer, got {type(optimizer).__name__}")
    comp = _compressors.get(compressor, **(compressor_options or {}))
    ctrl = _make_controller(controller)
    if process_set is None:
        process_set = hvd.global_process_set
    cls = type(optimizer.__class__.__name__, (optimizer.__class__,),
               dict(_DistributedOptimizer.__dict__))
    return cls(optimizer.param_groups, named_parameters, comp, ctrl, min_compress_numel,
               batch_size, process_set, name_prefix, nonfinite, max_consecutive_skips,
               defer_agreement)
