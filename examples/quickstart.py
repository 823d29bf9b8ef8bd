"""Quickstart: gravac in your own Horovod training loop (static Top-k, CF 100).

Trains a small MLP on scikit-learn's handwritten digits (ships with scikit-learn, no
download), each rank on its own shard, and prints the loss and accuracy per epoch.

    .venv/bin/horovodrun -np 2 -H localhost:2 --gloo .venv/bin/python examples/quickstart.py
"""
import argparse

import horovod.torch as hvd
import torch
import torch.nn.functional as F
from sklearn.datasets import load_digits

import gravac


def load_shard(rank: int, size: int):
    """Digits scaled to [0, 1]; a fixed 80/20 split; this rank's slice of the training part."""
    digits = load_digits()
    x = torch.tensor(digits.data, dtype=torch.float32) / 16.0
    y = torch.tensor(digits.target, dtype=torch.int64)
    perm = torch.randperm(len(y), generator=torch.Generator().manual_seed(0))
    x, y = x[perm], y[perm]
    n_test = len(y) // 5
    train_x, train_y = x[n_test:], y[n_test:]
    shard = len(train_y) // size
    lo = rank * shard
    return (train_x[lo:lo + shard], train_y[lo:lo + shard]), (x[:n_test], y[:n_test])


def main(args):
    hvd.init()
    torch.set_num_threads(1)
    torch.manual_seed(args.seed)
    (x, y), (test_x, test_y) = load_shard(hvd.rank(), hvd.size())
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(),
                                torch.nn.Linear(256, 128), torch.nn.ReLU(),
                                torch.nn.Linear(128, 10))
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    # The gravac part: sparse allgather of each rank's Top-1% with error feedback.
    opt = gravac.DistributedOptimizer(opt, model.named_parameters(), compressor=args.compressor,
                                      controller=gravac.controllers.Static(cf=args.cf),
                                      batch_size=args.batch_size)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(opt, root_rank=0)

    floats = dense = 0
    for epoch in range(args.epochs):
        order = torch.randperm(len(y), generator=torch.Generator().manual_seed(epoch))
        total = 0.0
        for i in range(0, len(y) - args.batch_size + 1, args.batch_size):
            idx = order[i:i + args.batch_size]
            opt.zero_grad()
            loss = F.cross_entropy(model(x[idx]), y[idx])
            loss.backward()
            opt.step()
            total += loss.item()
            floats += opt.last_stats.floats_sent
            dense += opt.last_stats.dense_floats
        steps = len(y) // args.batch_size
        avg = hvd.allreduce(torch.tensor(total / steps), name="epoch_loss")
        with torch.no_grad():
            acc = (model(test_x).argmax(1) == test_y).float().mean()
        if hvd.rank() == 0:
            print(f"epoch {epoch + 1:2d}  loss {float(avg):.4f}  test accuracy {float(acc):.3f}  "
                  f"floats sent {floats / dense:.3f} of dense", flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--compressor", default="topk",
                        choices=sorted(gravac.compressors.REGISTRY))
    parser.add_argument("--cf", type=float, default=100.0, help="compression factor (1 = dense)")
    parser.add_argument("--epochs", type=int, default=15)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--seed", type=int, default=0)
    main(parser.parse_args())
