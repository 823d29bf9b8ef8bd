"""A user's own ``hvd.elastic.run`` script with gravac's optimizer, as docs/HOROVOD.md
("Horovod Elastic") writes it; ``test_elastic.py`` changes the hosts while it runs.

    python elastic_user_script.py OUT_FILE STOP_FILE CONTROLLER

Every step appends ``step rank size same`` to OUT_FILE (``same``: 1 when every rank holds
the same parameters after the step). It trains until STOP_FILE exists (rank 0 looks, every
rank learns it by broadcast: all ranks leave the loop at the same step).
CONTROLLER: ``static`` (Top-k 10x) or ``gravac`` (windows of 3 steps, whose broadcasts
need every rank on the same step clock).
"""
import sys
import time
from pathlib import Path

import horovod.torch as hvd
import torch
import torch.nn.functional as F

import gravac
from gravac.comm.horovod import HorovodComm
from gravac.controllers import GraVAC, Static

out, stop, controller = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
hvd.init()
torch.set_num_threads(1)
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 2))
opt = gravac.DistributedOptimizer(
    torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9), model.named_parameters(),
    controller=GraVAC(window=3) if controller == "gravac" else Static(cf=10),
    defer_agreement=True)
state = hvd.elastic.TorchState(model, opt, batch=0)


@hvd.elastic.run
def train(state):
    opt.reset_world(HorovodComm())
    while not hvd.broadcast_object(stop.exists(), root_rank=0, name="stop"):
        torch.manual_seed(1000 * state.batch + hvd.rank())
        opt.zero_grad()
        x = torch.randn(8, 32)
        F.cross_entropy(model(x), (x[:, 0] > 0).long()).backward()
        opt.step()
        flat = torch.cat([p.detach().flatten() for p in model.parameters()])
        everyone = hvd.allgather(flat.unsqueeze(0), name="params")
        same = int(bool((everyone == everyone[0]).all()))
        state.batch += 1
        with out.open("a") as f:
            f.write(f"{state.batch} {hvd.rank()} {hvd.size()} {same}\n")
        if state.batch % 4 == 0:
            state.commit()
        time.sleep(0.05)


train(state)
