"""``gravac.hvd.Compression``: Horovod's ``Compression`` namespace with gravac's methods.

``Compression.none`` and ``Compression.fp16`` are Horovod's own; ``topk``, ``dgc``,
``redsync``, ``randomk``, ``powersgd``, ``gravac``, ``accordion`` and ``auto`` return a
``GravacCompression``, a ``horovod.torch.compression.Compressor`` subclass that names a
gravac method (compressor, controller, options). Hand it to ``gravac.DistributedOptimizer``
as a Horovod user hands ``hvd.Compression.fp16`` to ``hvd.DistributedOptimizer``::

    import horovod.torch as hvd, gravac
    from gravac.hvd import Compression
    opt = gravac.DistributedOptimizer(opt, model.named_parameters(),
                                      compression=Compression.gravac(theta_min=10, window=200))

Why an allgather and not Horovod's optimizer: Horovod's ``DistributedOptimizer`` allreduces
(sums) whatever ``compress`` returns, so a compressor's output must add up element by
element; a sparse selection does not (every rank keeps other indices), and the residual
that error feedback keeps, and the controller's CF that every rank must share, live
outside ``compress``. gravac's optimizer packs each rank's selection in gravac's sparse
format (values, then int32 indices) and allgathers it; ``GravacCompression.compress`` and
``decompress`` are that format for one tensor (for ``hvd.allgather`` by hand), and refuse,
in one line, to be called by Horovod's own optimizer.
"""
from __future__ import annotations

import dataclasses
import inspect
import sys
from typing import Callable

import torch
from horovod.torch.compression import Compression as _HorovodCompression
from horovod.torch.compression import Compressor as _HorovodCompressor

from .. import compressors as _compressors
from ..controllers import Accordion, Auto, GraVAC, Static
from ..engine.codec import SparseCodec, SparseLayer
from ..engine.options import GravacOptions
from ..util.sizes import num_kept

_OPTION_NAMES = frozenset(f.name for f in dataclasses.fields(GravacOptions))


class GravacCompression(_HorovodCompressor):
    """A gravac method as a Horovod ``Compressor``: what ``gravac.DistributedOptimizer``
    builds its compressor, controller and options from (a fresh controller per optimizer).

    ``compress(tensor)`` selects ``cf``'s share of one tensor (no error feedback: that is
    the optimizer's) and packs it: ``(uint8 buffer, ctx)``; ``decompress(gathered, ctx)``
    averages the buffers of ``hvd.allgather(buffer)`` into a dense tensor. PowerSGD and
    ``auto`` have no one-tensor form (two rounds; a method per step).

    Example::

        c = Compression.topk(cf=100)
        buf, ctx = c.compress(grad)
        average = c.decompress(hvd.allgather(buf), ctx)
    """

    def __init__(self, compressor: str, controller: Callable[[], object],
                 compressor_options: dict | None = None, options: dict | None = None,
                 cf: float | None = None, label: str = ""):
        self.compressor = compressor
        self.compressor_options = dict(compressor_options or {})
        self._make_controller = controller
        self.options = dict(options or {})
        self.cf = cf
        self.label = label or compressor
        # Bad values fail here, in one line, not at the optimizer.
        _compressors.get(compressor, **self.compressor_options)
        controller()
        GravacOptions(**self.options).check()

    def __repr__(self) -> str:
        return f"gravac.hvd.Compression.{self.label}"

    def make_controller(self):
        """A new controller of this method (each optimizer needs its own state)."""
        return self._make_controller()

    def compress(self, tensor: torch.Tensor):
        _refuse_horovods_optimizer(self)
        if self.cf is None:
            raise ValueError(f"{self!r} has no one-tensor form (PowerSGD's factors take two "
                             "rounds; auto picks a method per step): use it through "
                             "gravac.DistributedOptimizer")
        flat = tensor.detach().reshape(-1)
        comp = _compressors.get(self.compressor, **self.compressor_options)
        idx = comp.select(flat, num_kept(flat.numel(), self.cf))
        codec = SparseCodec([SparseLayer("tensor", flat.numel(), flat.dtype)], flat.device)
        buffer, ctx = codec.pack([(flat.index_select(0, idx), idx)])
        return buffer, (codec, ctx, tensor.shape)

    def decompress(self, tensor: torch.Tensor, ctx):
        _refuse_horovods_optimizer(self)
        codec, pack_ctx, shape = ctx
        chunks = sum(1 for _ in codec.unpack(tensor, pack_ctx))
        flat = codec.aggregate(tensor, pack_ctx, world_size=chunks,
                               accumulate_dtype=pack_ctx.wire_dtype)
        return flat.view(shape)


def _refuse_horovods_optimizer(compression) -> None:
    frame = sys._getframe(2)
    for _ in range(3):
        if frame is None:
            return
        if frame.f_code.co_filename.replace("\\", "/").endswith("horovod/torch/optimizer.py"):
            raise TypeError(f"{compression!r} sends a sparse selection, which "
                            "hvd.DistributedOptimizer would allreduce (sum) as if it were a "
                            "tensor; use gravac.DistributedOptimizer(opt, compression=...)")
        frame = frame.f_back


def _split(kwargs: dict, controller_cls, method: str) -> tuple[dict, dict]:
    """``kwargs`` as (the controller's arguments, gravac's options), refusing others."""
    accepted = set(inspect.signature(controller_cls.__init__).parameters) - {"self"}
    mine = {k: v for k, v in kwargs.items() if k in accepted}
    options = {k: v for k, v in kwargs.items() if k in _OPTION_NAMES}
    unknown = sorted(set(kwargs) - set(mine) - set(options))
    if unknown:
        raise ValueError(f"Compression.{method}({unknown[0]}=...): not an argument of "
                         f"{controller_cls.__name__} ({', '.join(sorted(accepted))}) nor a gravac "
                         f"option ({', '.join(sorted(_OPTION_NAMES))})")
    return mine, options


def _sparsifier(name: str):
    def method(cf: float = 100, compressor_options: dict | None = None, **options):
        _, options = _split(options, Static, name)
        return GravacCompression(name, lambda: Static(cf=cf), compressor_options, options,
                                 cf=cf, label=f"{name}(cf={cf!r})")
    method.__name__ = name
    method.__doc__ = (f"{name} at a static compression factor ``cf``; ``compressor_options``: "
                      f"{name}'s own; other keywords: gravac's options (``GravacOptions``).")
    return staticmethod(method)


class Compression:
    """Horovod's ``Compression`` with gravac's methods (see the module docstring)."""

    none = _HorovodCompression.none
    fp16 = _HorovodCompression.fp16
    topk = _sparsifier("topk")
    dgc = _sparsifier("dgc")
    redsync = _sparsifier("redsync")
    randomk = _sparsifier("randomk")

    @staticmethod
    def powersgd(rank: int = 4, compressor_options: dict | None = None, **options):
        """PowerSGD at a static ``rank``; other keywords: gravac's options."""
        _, options = _split(options, Static, "powersgd")
        return GravacCompression("powersgd", lambda: Static(rank=rank), compressor_options,
                                 options, label=f"powersgd(rank={rank!r})")

    @staticmethod
    def gravac(compressor: str = "topk", compressor_options: dict | None = None, **kwargs):
        """GraVAC (``gravac.controllers.GraVAC``'s arguments: theta_min, theta_max,
        epsilon, window, ...) over ``compressor``; other keywords: gravac's options."""
        mine, options = _split(kwargs, GraVAC, "gravac")
        ctrl = GraVAC(**mine)
        return GravacCompression(compressor, lambda: GraVAC(**mine), compressor_options,
                                 options, cf=ctrl.theta_min, label="gravac(...)")

    @staticmethod
    def accordion(compressor: str = "topk", compressor_options: dict | None = None, **kwargs):
        """Accordion (``gravac.controllers.Accordion``'s arguments) over ``compressor``."""
        mine, options = _split(kwargs, Accordion, "accordion")
        ctrl = Accordion(**mine)
        lowrank = compressor == "powersgd"
        return GravacCompression(compressor, lambda: Accordion(**mine), compressor_options,
                                 options, cf=None if lowrank else ctrl.low_cf,
                                 label="accordion(...)")

    @staticmethod
    def auto(compressor: str = "topk", compressor_options: dict | None = None, **kwargs):
        """gravac's measured choice of method (``gravac.controllers.Auto``'s arguments:
        methods, epsilon, ...); sparse methods use ``compressor``."""
        mine, options = _split(kwargs, Auto, "auto")
        return GravacCompression(compressor, lambda: Auto(**mine), compressor_options,
                                 options, label="auto(...)")


def resolve_compression(compression, compressor, controller, compressor_options, options):
    """What ``gravac.DistributedOptimizer(compression=...)`` means: (compressor,
    controller, compressor_options, options). Horovod's ``Compression.none`` changes
    nothing, ``Compression.fp16`` sends the dense layers as fp16 (``dense_wire``); a
    ``GravacCompression`` names the method, which ``compressor=``/``controller=`` must then
    leave alone."""
    if compression is None or compression is _HorovodCompression.none:
        return compressor, controller, compressor_options, options
    if compression is _HorovodCompression.fp16:
        if options.get("dense_wire", "fp16") != "fp16":
            raise ValueError(f"compression=Compression.fp16 and dense_wire="
                             f"{options['dense_wire']!r} disagree; pass one of them")
        return compressor, controller, compressor_options, {**options, "dense_wire": "fp16"}
    if isinstance(compression, GravacCompression):
        given = [n for n, v in (("compressor", compressor), ("controller", controller),
                                ("compressor_options", compressor_options)) if v is not None]
        given += sorted(set(compression.options) & set(options))
        if given:
            raise ValueError(f"compression={compression!r} names the method already; drop "
                             f"{given[0]}= (or pass it to the Compression call)")
        return (compression.compressor, compression.make_controller(),
                compression.compressor_options, {**compression.options, **options})
    if isinstance(compression, (str, _compressors.Compressor)):
        raise ValueError(f"compression={compression!r}: pass compressor={compression!r} "
                         "(gravac's name) or compression=gravac.hvd.Compression.topk(cf=...)")
    raise ValueError(f"compression={compression!r}: use hvd.Compression.none or .fp16, or one of "
                     "gravac.hvd.Compression's methods (topk, dgc, redsync, randomk, powersgd, "
                     "gravac, accordion, auto)")
