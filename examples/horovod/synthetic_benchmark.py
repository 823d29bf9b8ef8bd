"""Horovod's synthetic benchmark (examples/pytorch/pytorch_synthetic_benchmark.py) with
gravac: a ResNet (on GPUs with Horovod's ``SyncBatchNorm``: collectives in the forward pass beside
gravac's in ``step()``) on fixed random data, timed with ``timeit``; the optimizer line is
the only change (``--horovod`` runs Horovod's own optimizer instead).

    .venv/bin/horovodrun -np 2 -H localhost:2 --gloo .venv/bin/python \\
        examples/horovod/synthetic_benchmark.py --model resnet18 --batch-size 16
"""
import argparse
import timeit

import horovod.torch as hvd
import numpy as np
import torch
import torch.nn.functional as F

import gravac
from gravac.models import IMAGE_MODELS, build_model
from common import print_result

parser = argparse.ArgumentParser(description="Horovod's synthetic benchmark with gravac",
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
parser.add_argument("--fp16-allreduce", action="store_true")
parser.add_argument("--model", default="resnet50", choices=IMAGE_MODELS,
                    help="a gravac.models image classifier (RGB input)")
parser.add_argument("--batch-size", type=int, default=32)
parser.add_argument("--image-size", type=int, default=32)
parser.add_argument("--num-warmup-batches", type=int, default=10)
parser.add_argument("--num-batches-per-iter", type=int, default=10)
parser.add_argument("--num-iters", type=int, default=10)
parser.add_argument("--use-adasum", action="store_true")
parser.add_argument("--no-cuda", action="store_true", help="train on the CPU")
parser.add_argument("--horovod", action="store_true", help="hvd.DistributedOptimizer instead")


def sync_batch_norm(module: torch.nn.Module) -> torch.nn.Module:
    """``module`` with every BatchNorm2d replaced by Horovod's SyncBatchNorm (the example
    builds torchvision's model with ``norm_layer=hvd.SyncBatchNorm``; it runs on GPUs
    only)."""
    for name, child in module.named_children():
        if isinstance(child, torch.nn.BatchNorm2d):
            setattr(module, name, hvd.SyncBatchNorm(child.num_features, eps=child.eps,
                                                    momentum=child.momentum))
        else:
            sync_batch_norm(child)
    return module


def main(args):
    hvd.init()
    torch.set_num_threads(1)
    cuda = torch.cuda.is_available() and not args.no_cuda
    model = build_model(args.model, num_classes=1000)
    if cuda:
        torch.cuda.set_device(hvd.local_rank())
        model = sync_batch_norm(model).cuda()
    lr_scaler = hvd.size() if not args.use_adasum else 1
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01 * lr_scaler)
    compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none

    # The one line a Horovod user changes (hvd.DistributedOptimizer -> gravac's).
    DistributedOptimizer = hvd.DistributedOptimizer if args.horovod else gravac.DistributedOptimizer
    optimizer = DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                     compression=compression,
                                     op=hvd.Adasum if args.use_adasum else hvd.Average)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)

    data = torch.randn(args.batch_size, 3, args.image_size, args.image_size)
    target = torch.LongTensor(args.batch_size).random_() % 1000
    if cuda:
        data, target = data.cuda(), target.cuda()
    losses = []

    def benchmark_step():
        optimizer.zero_grad()
        loss = F.cross_entropy(model(data), target)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())

    def log(s):
        if hvd.rank() == 0:
            print(s, flush=True)

    device = "GPU" if cuda else "CPU"
    log(f"Model: {args.model}\nBatch size: {args.batch_size}\nNumber of {device}s: {hvd.size()}")
    log("Running warmup...")
    timeit.timeit(benchmark_step, number=args.num_warmup_batches)
    log("Running benchmark...")
    img_secs = []
    for x in range(args.num_iters):
        time = timeit.timeit(benchmark_step, number=args.num_batches_per_iter)
        img_secs.append(args.batch_size * args.num_batches_per_iter / time)
        log(f"Iter #{x}: {img_secs[-1]:.1f} img/sec per {device}")
    mean, conf = np.mean(img_secs), 1.96 * np.std(img_secs)
    log(f"Img/sec per {device}: {mean:.1f} +-{conf:.1f}")
    log(f"Total img/sec on {hvd.size()} {device}(s): {hvd.size() * mean:.1f} "
        f"+-{hvd.size() * conf:.1f}")
    print_result("synthetic_benchmark", model, steps=len(losses), img_sec=float(mean),
                 loss_first=losses[0], loss_last=losses[-1])


if __name__ == "__main__":
    main(parser.parse_args())
