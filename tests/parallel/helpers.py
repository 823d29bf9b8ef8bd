"""The transport under test, small models, per-rank data and reference computations
shared by parallel tests."""
import copy
from pathlib import Path

import pytest
import torch

import gravac.comm

#: "horovod" under horovodrun, "torch" under torchrun: every test runs on both.
BACKEND = gravac.comm.detect_backend()
#: gloo under torchrun even where a GPU is visible: the suites' tensors are on the CPU, and
#: the CUDA suite (test_cuda_two_ranks.py) runs 2 ranks on one GPU, which NCCL refuses;
#: gloo moves CUDA tensors through the host. (Horovod ignores ``gpu``.)
COMM = gravac.comm.init(BACKEND, gpu=False)
#: A case whose transport-specific part another case of the same test covers on both
#: transports (a resume of one more controller: the checkpoint code is the transport's
#: alike): it runs under torchrun only, to keep the suite's time.
ONE_TRANSPORT = pytest.mark.skipif(BACKEND == "horovod", reason="the same transport path as "
                                   "another case of this test, which runs under Horovod")
torch.set_num_threads(1)


def distributed_optimizer(optimizer, named_parameters, **kwargs):
    """gravac's optimizer on this run's transport (the front end a user would call)."""
    if BACKEND == "horovod":
        import gravac
        return gravac.DistributedOptimizer(optimizer, named_parameters, **kwargs)
    import gravac.torch
    return gravac.torch.DistributedOptimizer(optimizer, named_parameters, **kwargs)


class PlainAllreduce:
    """The dense reference a user would run, not gravac's code: Horovod's own
    ``hvd.DistributedOptimizer``, or on torch.distributed an ``all_reduce`` sum of each
    gradient divided by the number of ranks (what DDP computes)."""

    def __init__(self, optimizer, model):
        self.model = model
        if BACKEND == "horovod":
            import horovod.torch as hvd
            self.opt = hvd.DistributedOptimizer(optimizer,
                                                named_parameters=model.named_parameters())
        else:
            self.opt = optimizer

    def zero_grad(self):
        self.opt.zero_grad()

    def step(self):
        if BACKEND != "horovod":
            import torch.distributed as dist
            for p in self.model.parameters():
                dist.all_reduce(p.grad, op=dist.ReduceOp.SUM)
                p.grad.div_(COMM.size)
        self.opt.step()


def barrier(name):
    """Both ranks got here (a test that asserts after its last collective ends with it)."""
    COMM.barrier(name)


class Net(torch.nn.Module):
    """Two compressible layers (>= 1024 elements) and several small dense ones."""

    def __init__(self, d_in=32, hidden=96, d_out=10):
        super().__init__()
        self.fc1 = torch.nn.Linear(d_in, hidden)       # 3072 weights: compressed
        self.fc2 = torch.nn.Linear(hidden, hidden)     # 9216 weights: compressed
        self.out = torch.nn.Linear(hidden, d_out)      # 960 weights: dense
        self.norm = torch.nn.LayerNorm(hidden)

    def forward(self, x):
        h = torch.relu(self.fc1(x))
        h = self.norm(torch.relu(self.fc2(h)))
        return self.out(h)


def make_net(seed=0):
    torch.manual_seed(seed)
    return Net()


def rank_batch(step, rank, batch=16, d_in=32, d_out=10):
    """Different data on every rank and step (inputs, class targets)."""
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(batch, d_in, generator=g), torch.randint(0, d_out, (batch,), generator=g)


def gather_rows(t, name):
    """Every rank's copy of ``t`` stacked along a new first dimension."""
    rows = COMM.allgather_object(t.detach().reshape(-1).clone(), name=name)
    return torch.stack(rows)


def clone_model(model):
    return copy.deepcopy(model)


def topk_sent(g_ef, k):
    """Reference Top-k, independent of gravac: the dense tensor of what a rank sends."""
    idx = torch.topk(g_ef.abs(), k).indices
    sent = torch.zeros_like(g_ef)
    sent[idx] = g_ef[idx]
    return sent


REPO = Path(__file__).resolve().parents[2]


def demo_config(out, name, *compression_files, steps=40, extra=()):
    """configs/demo.yaml (+ files of configs/compression/) writing to ``out/name``, quiet."""
    from gravac.train.config import load_config

    files = [str(REPO / "configs/demo.yaml"),
             *[str(REPO / "configs/compression" / f) for f in compression_files]]
    return load_config(files, [f"run.output_dir={out}", f"run.name={name}", f"run.steps={steps}",
                               "run.log_interval=1", "run.progress=never", *extra])
