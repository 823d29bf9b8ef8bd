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
from ..engine.options import GravacOptions


def DistributedOptimizer(optimizer, named_parameters, compressor="topk", controller=None,
                         compressor_options: dict | None = None, process_set=None, comm=None,
                         **options):
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
        compressor_options: keyword options of the named compressor.
        process_set: Horovod process set (default: all ranks).
        comm: a ``gravac.comm.Comm`` to use instead of Horovod (e.g. ``LocalComm()``);
            then ``process_set`` must be None.
        **options: the fields of ``gravac.engine.GravacOptions`` (listed below, with
            their defaults; the same keys as a config file's ``compression`` section).

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
                          controller=controller, compressor_options=compressor_options,
                          **options)


DistributedOptimizer.__doc__ += "\n    Options:\n" + GravacOptions.doc() + "\n"
