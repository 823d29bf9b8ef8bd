"""gravac.DistributedOptimizer: the Horovod front end (the default).

``hvd.DistributedOptimizer``'s signature, so that swapping the optimizer line of a Horovod
script is the whole change; gravac's own arguments follow as keywords. Per step, for every
parameter that has a gradient: layers of at least ``min_compress_numel`` elements are
error-fed (g_ef = grad + residual) and sparsified to the controller's CF (optionally a
second, candidate level over the kept values); all sparse layers travel in ONE fused
allgather and all dense ones in ONE grouped allreduce (average); residuals keep what was
not sent; then the wrapped optimizer steps. The step itself is
``gravac.engine.StepEngine``; this module only maps Horovod's arguments and builds its
Horovod ``Comm``.
"""
from __future__ import annotations

import horovod.torch as hvd
import torch

from ..comm.horovod import HorovodComm
from ..engine.optimizer import wrap_optimizer
from ..engine.options import GravacOptions
from .compression import resolve_compression

#: Horovod's reduction ops as gravac's ``op`` option (Adasum is refused: it is not an
#: average of compressed gradients).
_OPS = {hvd.Average: "average", hvd.Sum: "sum", "average": "average", "sum": "sum"}


def DistributedOptimizer(optimizer, named_parameters=None, compression=None,
                         backward_passes_per_step=1, op=hvd.Average,
                         gradient_predivide_factor=1.0, num_groups=0, groups=None,
                         sparse_as_dense=False, process_set=None, *, compressor=None,
                         controller=None, compressor_options: dict | None = None, comm=None,
                         **options):
    """Wrap a torch optimizer so that ``step()`` averages gradients across Horovod ranks
    with compressed (sparse) communication and error feedback.

    Like ``hvd.DistributedOptimizer``, the returned object is an instance of a subclass of
    the wrapped optimizer's class, built from its param groups (its state is not copied:
    wrap it before training or load a state dict afterwards), and it takes
    ``hvd.DistributedOptimizer``'s arguments with their meanings:

    Args:
        optimizer: any ``torch.optim.Optimizer``.
        named_parameters: ``model.named_parameters()`` (names key the residual memory in
            checkpoints); None names them by position, as Horovod does.
        compression: ``hvd.Compression.none`` (gravac's default method), ``.fp16`` (the
            layers sent dense go as fp16), or a method of ``gravac.hvd.Compression``
            (``topk(cf=100)``, ``gravac(...)``, ``powersgd(rank=4)``, ``auto(...)``, ...).
        backward_passes_per_step: backward passes accumulated per step (``step()`` sends
            what they accumulated; with ``overlap=True`` the hooks send after the last).
        op: ``hvd.Average`` or ``hvd.Sum`` (``hvd.Adasum`` is refused).
        gradient_predivide_factor: Horovod's split average (op Average only).
        num_groups, groups: accepted (Horovod's grouping of allreduces); gravac's step
            already sends every layer of a kind in one fused collective.
        sparse_as_dense: accepted either way: a sparse gradient (an embedding's) is
            compressed as a dense tensor and handed back to the optimizer sparse.
        process_set: Horovod process set (default: all ranks).
        compressor: ``"topk"`` (default), ``"dgc"``, ``"redsync"``, ``"randomk"``,
            ``"powersgd"``, ``"none"`` or a ``gravac.compressors.Compressor``.
        controller: ``gravac.controllers.Static(cf=100)`` (default), ``GraVAC(...)``,
            ``Accordion(...)``, ``Auto(...)``, or a number for a static CF.
        compressor_options: keyword options of the named compressor.
        comm: a ``gravac.comm.Comm`` to use instead of Horovod (e.g. ``LocalComm()``);
            then ``process_set`` must be None.
        **options: the fields of ``gravac.engine.GravacOptions`` (listed below, with
            their defaults; the same keys as a config file's ``compression`` section).

    After each ``step()``, ``optimizer.last_stats`` (a ``gravac.engine.StepStats``)
    describes it (CF sent, gains, floats sent, timings) and ``optimizer.memory[name]`` is
    the residual of a parameter.

    Example (a Horovod script, with only the optimizer line changed)::

        import horovod.torch as hvd, torch, gravac
        hvd.init()
        model = Net()
        opt = torch.optim.SGD(model.parameters(), lr=0.1 * hvd.size(), momentum=0.9)
        opt = gravac.DistributedOptimizer(opt, named_parameters=model.named_parameters(),
                                          compression=hvd.Compression.fp16)
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        hvd.broadcast_optimizer_state(opt, root_rank=0)
        for x, y in loader:
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
    """
    if comm is not None and process_set is not None:
        raise ValueError("pass either comm or process_set, not both")
    if op not in _OPS:
        # Horovod's ops are bare ints (hvd.Adasum is 2): name it as the user wrote it.
        named = {getattr(hvd, n): f"hvd.{n}" for n in ("Average", "Sum", "Adasum", "Min",
                                                       "Max", "Product") if hasattr(hvd, n)}
        shown = named.get(op, repr(op)) if isinstance(op, int) else repr(op)
        raise ValueError(f"op={shown}: gravac.DistributedOptimizer takes hvd.Average or "
                         "hvd.Sum (Adasum combines whole gradients, not compressed ones)")
    _check_groups(num_groups, groups)
    if not isinstance(sparse_as_dense, bool):
        raise ValueError(f"sparse_as_dense={sparse_as_dense!r}: must be true or false")
    compressor, controller, compressor_options, options = resolve_compression(
        compression, compressor, controller, compressor_options, options)
    options = {"backward_passes_per_step": backward_passes_per_step, "op": _OPS[op],
               "gradient_predivide_factor": gradient_predivide_factor, **options}
    if comm is None:
        comm = HorovodComm(process_set or hvd.global_process_set)
    return wrap_optimizer(optimizer, named_parameters, comm,
                          compressor="topk" if compressor is None else compressor,
                          controller=controller, compressor_options=compressor_options,
                          **options)


def _check_groups(num_groups, groups) -> None:
    """Horovod's rules for its grouping arguments (bad values fail as there)."""
    if isinstance(num_groups, bool) or not isinstance(num_groups, int) or num_groups < 0:
        raise ValueError(f"num_groups={num_groups!r}: must be an int >= 0")
    if groups is None or (isinstance(groups, int) and not isinstance(groups, bool)
                          and groups >= 0):
        return
    if not isinstance(groups, list):
        raise ValueError(f"groups={groups!r}: must be an int >= 0 or a list of lists of "
                         "parameters")
    seen = set()
    for group in groups:
        for p in group:
            if not isinstance(p, torch.Tensor):
                raise ValueError("groups must consist of lists of parameters (torch.Tensor)")
            if id(p) in seen:
                raise ValueError("groups: a parameter can only appear once")
            seen.add(id(p))


DistributedOptimizer.__doc__ += "\n    Options:\n" + GravacOptions.doc() + "\n"
