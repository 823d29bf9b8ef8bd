"""gravac/train/method.py: the method chosen once from the config and the transport, and
what the trainer asks it (optimizer, model wrapper, describe line, run_start fields,
the step with clipping)."""
import pytest
import torch

from gravac.comm.local import LocalComm
from gravac.engine import StepStats
from gravac.engine.options import GravacOptions
from gravac.train.config import load_config
from gravac.train.method import (Gravac, HorovodAllreduce, TorchDDP, build_method,
                                 dense_fp16)

DEMO = "configs/demo.yaml"


class _Horovod(LocalComm):
    backend = "horovod"


class _Torch(LocalComm):
    backend = "torch"


def _cfg(tmp_path, *sets, files=()):
    return load_config([DEMO, *files], [f"run.output_dir={tmp_path}", *sets])


@pytest.mark.parametrize("comm, dense, expected", [
    (_Horovod, True, HorovodAllreduce), (_Torch, True, TorchDDP), (LocalComm, True, Gravac),
    (_Horovod, False, Gravac), (_Torch, False, Gravac), (LocalComm, False, Gravac)])
def test_dense_is_the_transports_own_baseline_else_gravac(tmp_path, comm, dense, expected):
    files = ("configs/compression/dense.yaml",) if dense else ()
    method = build_method(_cfg(tmp_path, files=files), comm())
    assert type(method) is expected
    assert method.kind == {HorovodAllreduce: "horovod", TorchDDP: "ddp", Gravac: "gravac"}[expected]


def test_the_baselines_describe_and_start_lines(tmp_path):
    dense, fp16 = "configs/compression/dense.yaml", "configs/compression/horovod_fp16.yaml"
    cfg = _cfg(tmp_path, files=(fp16,))
    assert dense_fp16(cfg)
    assert build_method(cfg, _Horovod()).describe(None) == \
        "dense Horovod allreduce (compression fp16)"
    assert build_method(cfg, _Torch()).describe(None) == "dense PyTorch DDP (hook: fp16)"
    assert build_method(cfg, _Torch()).start_fields() == {"controller": "dense",
                                                          "compressor": "fp16"}
    cfg = _cfg(tmp_path, files=(dense,))
    assert build_method(cfg, _Horovod()).describe(None) == \
        "dense Horovod allreduce (compression none)"
    assert build_method(cfg, _Horovod()).start_fields()["compressor"] == "none"
    cfg = _cfg(tmp_path, "compression.ddp_start_powersgd_iter=30",
               files=("configs/compression/ddp_powersgd_rank4.yaml",))
    method = build_method(cfg, _Torch())
    assert method.describe(None) == "dense PyTorch DDP (hook: PowerSGD rank 4 from step 30)"
    assert method.start_fields()["compressor"] == "ddp_powersgd_rank4"
    # the baselines have no controller; before its start DDP's PowerSGD hook allreduces
    # every element (after it, its factors: test_ddp_powersgd_config.py)
    sgd = torch.optim.SGD(torch.nn.Linear(10, 100).parameters(), lr=0.1)
    stats = method.step_stats(sgd, 4, 1000)
    assert (stats.step, stats.sent, stats.floats_sent, stats.dense_floats, stats.bytes_sent) == \
        (4, "dense", 1000, 1000, 4000)
    assert method.controller(None) is None


def test_gravac_takes_the_engine_options_of_the_compression_section(tmp_path):
    cfg = _cfg(tmp_path, "compression.overlap=true", "compression.bucket_cap_mb=0.01",
               "compression.min_compress_numel=200", "compression.nonfinite=raise",
               "compression.max_consecutive_skips=3", "compression.dense_wire=fp16")
    method = build_method(cfg, LocalComm())
    model = torch.nn.Sequential(torch.nn.Linear(32, 16), torch.nn.Linear(16, 4))
    opt = method.build_optimizer(model)
    for f in GravacOptions.config_fields():
        assert getattr(opt.options, f.name) == getattr(cfg.compression, f.name), f.name
    assert opt.options.batch_size == cfg.data.batch_size
    assert method.controller(opt) is opt.controller
    assert method.start_fields() == {"controller": "gravac", "compressor": "topk"}
    assert method.describe(opt) == (f"compressor topk, controller {opt.controller!r}; 1 of 4 "
                                    "layers compressed; overlapped with backward in 1 bucket(s)")
    assert method.wrap_model(model) is model


def test_gravac_dense_in_one_process(tmp_path):
    cfg = _cfg(tmp_path, files=("configs/compression/dense.yaml",))
    method = build_method(cfg, LocalComm())
    opt = method.build_optimizer(torch.nn.Linear(64, 32))
    assert opt.compressor.is_dense and opt.compressed_layer_names == []
    assert method.describe(opt) == "dense: gravac's uncompressed allreduce over local (fp16: False)"
    assert method.start_fields() == {"controller": "dense", "compressor": "none"}


@pytest.mark.parametrize("comm, files", [
    (LocalComm, ()), (_Torch, ("configs/compression/dense.yaml",))])
def test_the_step_clips_the_averaged_gradient(tmp_path, comm, files):
    """gravac averages in step(): it synchronises, clips, then steps; DDP averaged in
    backward: it clips and steps. Either way the update is lr x the clipped gradient."""
    cfg = _cfg(tmp_path, "optimizer.momentum=0", "optimizer.weight_decay=0",
               "optimizer.lr=0.5", files=files)
    method = build_method(cfg, comm())
    torch.manual_seed(0)
    model = torch.nn.Linear(64, 32)
    opt = method.build_optimizer(model)
    before = [p.detach().clone() for p in model.parameters()]
    for p in model.parameters():
        p.grad = torch.full_like(p, 3.0)
    method.step(opt, model.parameters(), grad_clip=1.0)
    moved = torch.cat([(b - p.detach()).flatten() for b, p in zip(before, model.parameters())])
    assert moved.norm().item() == pytest.approx(0.5 * 1.0, rel=1e-4)
    if isinstance(method, Gravac):
        assert isinstance(method.step_stats(opt, 0, 0), StepStats)
