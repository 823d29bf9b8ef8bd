"""Horovod's ImageNet ResNet-50 example (examples/pytorch/pytorch_imagenet_resnet50.py) with
gravac: learning-rate warm-up, gradient accumulation over sub-batches
(``--batches-per-allreduce``, Horovod's ``backward_passes_per_step``), averaged metrics, a
checkpoint per epoch written by rank 0, and resuming the way the example does (rank 0 loads
the checkpoint, then ``hvd.broadcast_parameters`` and ``hvd.broadcast_optimizer_state``).
Synthetic images stand in for ImageNet; the optimizer line is the only change
(``--horovod`` runs Horovod's own optimizer instead).

    .venv/bin/horovodrun -np 2 -H localhost:2 --gloo .venv/bin/python \\
        examples/horovod/imagenet_resnet.py --epochs 2 --checkpoint-format /tmp/ckpt-{epoch}.pt
    # run it again with --epochs 3: it resumes from the last checkpoint
"""
import argparse
import math
import os

import horovod.torch as hvd
import torch
import torch.nn.functional as F
import torch.utils.data.distributed

import gravac
from gravac.models import IMAGE_MODELS, build_model
from common import print_result, synthetic_classes

parser = argparse.ArgumentParser(description="Horovod's ImageNet example with gravac",
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
parser.add_argument("--checkpoint-format", default="./checkpoint-{epoch}.pth.tar")
parser.add_argument("--fp16-allreduce", action="store_true")
parser.add_argument("--batches-per-allreduce", type=int, default=1)
parser.add_argument("--use-adasum", action="store_true")
parser.add_argument("--gradient-predivide-factor", type=float, default=1.0)
parser.add_argument("--model", default="resnet50", choices=IMAGE_MODELS,
                    help="a gravac.models image classifier (RGB input)")
parser.add_argument("--batch-size", type=int, default=32)
parser.add_argument("--val-batch-size", type=int, default=32)
parser.add_argument("--epochs", type=int, default=90)
parser.add_argument("--base-lr", type=float, default=0.0125)
parser.add_argument("--warmup-epochs", type=float, default=5)
parser.add_argument("--momentum", type=float, default=0.9)
parser.add_argument("--wd", type=float, default=0.00005)
parser.add_argument("--seed", type=int, default=42)
parser.add_argument("--train-samples", type=int, default=1024)
parser.add_argument("--image-size", type=int, default=32)
parser.add_argument("--no-cuda", action="store_true", help="train on the CPU")
parser.add_argument("--horovod", action="store_true", help="hvd.DistributedOptimizer instead")


class Metric:
    """A metric averaged over ranks (each update is an allreduce, as in the example)."""

    def __init__(self, name):
        self.name, self.sum, self.n = name, torch.tensor(0.0), torch.tensor(0.0)

    def update(self, val):
        self.sum += hvd.allreduce(val.detach().cpu(), name=self.name)
        self.n += 1

    @property
    def avg(self):
        return self.sum / self.n


def accuracy(output, target):
    return output.argmax(1).eq(target).float().mean()


def main(args):
    allreduce_batch_size = args.batch_size * args.batches_per_allreduce
    hvd.init()
    torch.manual_seed(args.seed)
    torch.set_num_threads(1)
    cuda = torch.cuda.is_available() and not args.no_cuda
    if cuda:
        torch.cuda.set_device(hvd.local_rank())

    resume_from_epoch = 0
    for try_epoch in range(args.epochs, 0, -1):
        if os.path.exists(args.checkpoint_format.format(epoch=try_epoch)):
            resume_from_epoch = try_epoch
            break
    # Rank 0 has the checkpoints: its epoch for every rank.
    resume_from_epoch = hvd.broadcast(torch.tensor(resume_from_epoch), root_rank=0,
                                      name="resume_from_epoch").item()
    verbose = hvd.rank() == 0

    train_dataset = synthetic_classes(args.train_samples, (3, args.image_size, args.image_size),
                                      seed=0)
    train_sampler = torch.utils.data.distributed.DistributedSampler(
        train_dataset, num_replicas=hvd.size(), rank=hvd.rank())
    train_loader = torch.utils.data.DataLoader(train_dataset, batch_size=allreduce_batch_size,
                                               sampler=train_sampler)
    val_dataset = synthetic_classes(args.train_samples // 4, (3, args.image_size, args.image_size),
                                    seed=1)
    val_sampler = torch.utils.data.distributed.DistributedSampler(
        val_dataset, num_replicas=hvd.size(), rank=hvd.rank())
    val_loader = torch.utils.data.DataLoader(val_dataset, batch_size=args.val_batch_size,
                                             sampler=val_sampler)

    model = build_model(args.model, num_classes=10)
    if cuda:
        model.cuda()
    lr_scaler = args.batches_per_allreduce * hvd.size() if not args.use_adasum else 1
    optimizer = torch.optim.SGD(model.parameters(), lr=args.base_lr * lr_scaler,
                                momentum=args.momentum, weight_decay=args.wd)
    compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none

    # The one line a Horovod user changes (hvd.DistributedOptimizer -> gravac's).
    DistributedOptimizer = hvd.DistributedOptimizer if args.horovod else gravac.DistributedOptimizer
    optimizer = DistributedOptimizer(
        optimizer, named_parameters=model.named_parameters(), compression=compression,
        backward_passes_per_step=args.batches_per_allreduce,
        op=hvd.Adasum if args.use_adasum else hvd.Average,
        gradient_predivide_factor=args.gradient_predivide_factor)

    # Rank 0 restores, then broadcasts weights and optimizer state to the others.
    if resume_from_epoch > 0 and hvd.rank() == 0:
        checkpoint = torch.load(args.checkpoint_format.format(epoch=resume_from_epoch),
                                map_location="cuda" if cuda else "cpu", weights_only=False)
        model.load_state_dict(checkpoint["model"])
        optimizer.load_state_dict(checkpoint["optimizer"])
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)

    def adjust_learning_rate(epoch, batch_idx):
        if epoch < args.warmup_epochs:
            epoch += float(batch_idx + 1) / len(train_loader)
            lr_adj = 1.0 / hvd.size() * (epoch * (hvd.size() - 1) / args.warmup_epochs + 1)
        elif epoch < 30:
            lr_adj = 1.0
        elif epoch < 60:
            lr_adj = 1e-1
        elif epoch < 80:
            lr_adj = 1e-2
        else:
            lr_adj = 1e-3
        for group in optimizer.param_groups:
            group["lr"] = args.base_lr * hvd.size() * args.batches_per_allreduce * lr_adj

    def train(epoch):
        model.train()
        train_sampler.set_epoch(epoch)
        train_loss = Metric("train_loss")
        for batch_idx, (data, target) in enumerate(train_loader):
            adjust_learning_rate(epoch, batch_idx)
            if cuda:
                data, target = data.cuda(), target.cuda()
            optimizer.zero_grad()
            for i in range(0, len(data), args.batch_size):       # sub-batches, accumulated
                output = model(data[i:i + args.batch_size])
                loss = F.cross_entropy(output, target[i:i + args.batch_size])
                train_loss.update(loss)
                loss.div_(math.ceil(float(len(data)) / args.batch_size))
                loss.backward()
            optimizer.step()
        return float(train_loss.avg)

    def validate():
        model.eval()
        val_loss, val_accuracy = Metric("val_loss"), Metric("val_accuracy")
        with torch.no_grad():
            for data, target in val_loader:
                if cuda:
                    data, target = data.cuda(), target.cuda()
                output = model(data)
                val_loss.update(F.cross_entropy(output, target))
                val_accuracy.update(accuracy(output, target))
        return float(val_loss.avg), float(val_accuracy.avg)

    def save_checkpoint(epoch):
        if hvd.rank() == 0:
            torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()},
                       args.checkpoint_format.format(epoch=epoch + 1))

    val_before = validate()[0]
    train_losses = []
    for epoch in range(resume_from_epoch, args.epochs):
        train_losses.append(train(epoch))
        val_loss, val_accuracy = validate()
        save_checkpoint(epoch)
        if verbose:
            print(f"epoch {epoch + 1}: train loss {train_losses[-1]:.4f}, val loss "
                  f"{val_loss:.4f}, val accuracy {100 * val_accuracy:.1f}%", flush=True)
    print_result("imagenet_resnet", model, resumed_from_epoch=resume_from_epoch,
                 epochs=len(train_losses), val_loss_before=val_before, val_loss_after=val_loss,
                 train_losses=train_losses)


if __name__ == "__main__":
    main(parser.parse_args())
