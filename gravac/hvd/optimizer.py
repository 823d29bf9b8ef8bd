"""gravac.DistributedOptimizer: the Horovod front end (the default).

Per step, for every parameter that has a gradient: layers of at least
``min_compress_numel`` elements are error-fed (g_ef = grad + residual) and sparsified to
the controller's CF (optionally a second, candidate level over the kept values); all
sparse layers travel in ONE fused allgather and all dense ones in ONE grouped allreduce
(average); residuals keep what was not sent; then the wrapped optimizer steps. The step
itself is ``gravac.engine.StepEngine``; this module only builds its Horovod ``Comm``.
"""
from __future__ import annotations

import horovod.torch as hvd

from ..comm.horovod import HorovodComm
from ..engine.optimizer import wrap_optimizer


def DistributedOptimizer(optimizer, named_parameters, compressor="topk", controller=None,
                         min_compress_numel: int = 1024, compressor_options: dict | None = None,
                         batch_size: int | None = None, process_set=None,
                         name_prefix: str = "gravac", nonfinite: str = "skip",
                         max_consecutive_skips: int = 10, defer_agreement: bool = False,
                         dense_wire: str = "native", overlap: bool = False,
                         bucket_cap_mb: float = 25.0, backward_passes_per_step: int = 1,
                         exchange: str = "allgather", comm=None):
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
        dense_wire: ``"fp16"`` sends the dense layers as fp16 (Horovod's
            ``Compression.fp16``); ``"native"`` (default) as they are.
        overlap: start each bucket's compression and exchange from gradient hooks while
            backward still runs (gravac/engine/overlap.py); ``step()`` then waits for them.
            The same parameters as without it, bit for bit, for Static and Accordion;
            GraVAC overlaps its compressed layers with ``GraVAC(decide="previous")`` only.
        bucket_cap_mb: with ``overlap``, MiB of gradient per bucket (cut in reverse layer
            order, the same on every rank).
        backward_passes_per_step: with ``overlap``, backward passes accumulated before the
            hooks send (gradient accumulation, as Horovod's option of that name).
        exchange: how sparse selections travel: ``"allgather"`` (default, the paper's:
            every rank receives every other's values and indices), ``"allgather_coded"``
            (the same with each layer's indices in ~1.1-2 bytes instead of 4, opt-in),
            ``"hierarchical"``
            (dense average inside each host, each host's average compressed and sent
            sparsely across hosts, its layers split among the host's ranks;
            Horovod needs HOROVOD_DYNAMIC_PROCESS_SETS=1) or ``"shared_index"`` (all ranks
            send values at the indices of each layer's leader, a rank that rotates every
            step, by allreduce: traffic independent of the number of ranks).
            docs/ALGORITHM.md §13.
        comm: a ``gravac.comm.Comm`` to use instead of Horovod (e.g. ``LocalComm()``);
            then ``process_set`` must be None.

    After each ``step()``, ``optimizer.last_stats`` (a ``gravac.engine.StepStats``)
    describes it (CF sent, gains, floats sent, timings) and ``optimizer.memory[name]`` is
    the residual of a parameter.

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
    if comm is not None and process_set is not None:
        raise ValueError("pass either comm or process_set, not both")
    if comm is None:
        comm = HorovodComm(process_set or hvd.global_process_set)
    return wrap_optimizer(optimizer, named_parameters, comm, compressor=compressor,
                          controller=controller, min_compress_numel=min_compress_numel,
                          compressor_options=compressor_options, batch_size=batch_size,
                          name_prefix=name_prefix, nonfinite=nonfinite,
                          max_consecutive_skips=max_consecutive_skips,
                          defer_agreement=defer_agreement, dense_wire=dense_wire,
                          overlap=overlap, bucket_cap_mb=bucket_cap_mb,
                          backward_passes_per_step=backward_passes_per_step,
                          exchange=exchange)
