"""Horovod's MNIST example (examples/pytorch/pytorch_mnist.py) with gravac: the training
script of a Horovod user, on synthetic 28x28 digits (no download), where the optimizer line
is the only change (``--horovod`` runs Horovod's own optimizer instead, for comparison).

    .venv/bin/horovodrun -np 2 -H localhost:2 --gloo .venv/bin/python examples/horovod/mnist.py \\
        [--fp16-allreduce] [--gradient-predivide-factor 2] [--use-mixed-precision]
"""
import argparse

import horovod.torch as hvd
import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.utils.data.distributed

import gravac
from common import print_result, synthetic_classes

parser = argparse.ArgumentParser(description="Horovod's MNIST example with gravac")
parser.add_argument("--batch-size", type=int, default=64)
parser.add_argument("--test-batch-size", type=int, default=1000)
parser.add_argument("--epochs", type=int, default=3)
parser.add_argument("--lr", type=float, default=0.01)
parser.add_argument("--momentum", type=float, default=0.5)
parser.add_argument("--seed", type=int, default=42)
parser.add_argument("--log-interval", type=int, default=10)
parser.add_argument("--fp16-allreduce", action="store_true", help="Compression.fp16")
parser.add_argument("--use-mixed-precision", action="store_true",
                    help="AMP: autocast and GradScaler (fp16 on a GPU, bf16 on a CPU)")
parser.add_argument("--use-adasum", action="store_true", help="Adasum (Horovod's only)")
parser.add_argument("--gradient-predivide-factor", type=float, default=1.0)
parser.add_argument("--train-samples", type=int, default=2048)
parser.add_argument("--no-cuda", action="store_true", help="train on the CPU")
parser.add_argument("--horovod", action="store_true", help="hvd.DistributedOptimizer instead")


class Net(nn.Module):
    """The example's network: two convolutions, dropout, two linear layers."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 10, kernel_size=5)
        self.conv2 = nn.Conv2d(10, 20, kernel_size=5)
        self.conv2_drop = nn.Dropout2d()
        self.fc1 = nn.Linear(320, 50)
        self.fc2 = nn.Linear(50, 10)

    def forward(self, x):
        x = F.relu(F.max_pool2d(self.conv1(x), 2))
        x = F.relu(F.max_pool2d(self.conv2_drop(self.conv2(x)), 2))
        x = F.relu(self.fc1(x.view(-1, 320)))
        x = F.dropout(x, training=self.training)
        return F.log_softmax(self.fc2(x), dim=1)


def main(args):
    hvd.init()
    torch.manual_seed(args.seed)
    torch.set_num_threads(1)
    cuda = torch.cuda.is_available() and not args.no_cuda
    device = "cuda" if cuda else "cpu"
    if cuda:
        torch.cuda.set_device(hvd.local_rank())

    train_dataset = synthetic_classes(args.train_samples, (1, 28, 28), seed=0)
    train_sampler = torch.utils.data.distributed.DistributedSampler(
        train_dataset, num_replicas=hvd.size(), rank=hvd.rank())
    train_loader = torch.utils.data.DataLoader(train_dataset, batch_size=args.batch_size,
                                               sampler=train_sampler)
    test_dataset = synthetic_classes(args.train_samples // 4, (1, 28, 28), seed=1)
    test_sampler = torch.utils.data.distributed.DistributedSampler(
        test_dataset, num_replicas=hvd.size(), rank=hvd.rank())
    test_loader = torch.utils.data.DataLoader(test_dataset, batch_size=args.test_batch_size,
                                              sampler=test_sampler)

    model = Net().to(device)
    lr_scaler = hvd.size() if not args.use_adasum else 1
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr * lr_scaler,
                                momentum=args.momentum)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none

    # The one line a Horovod user changes (hvd.DistributedOptimizer -> gravac's).
    DistributedOptimizer = hvd.DistributedOptimizer if args.horovod else gravac.DistributedOptimizer
    optimizer = DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                     compression=compression,
                                     op=hvd.Adasum if args.use_adasum else hvd.Average,
                                     gradient_predivide_factor=args.gradient_predivide_factor)

    scaler = torch.amp.GradScaler(device) if args.use_mixed_precision else None
    train_losses = []

    def train_epoch(epoch):
        model.train()
        train_sampler.set_epoch(epoch)
        for batch_idx, (data, target) in enumerate(train_loader):
            data, target = data.to(device), target.to(device)
            optimizer.zero_grad()
            if scaler is None:
                loss = F.nll_loss(model(data), target)
                loss.backward()
                optimizer.step()
            else:
                with torch.autocast(device, dtype=torch.float16 if cuda else torch.bfloat16):
                    loss = F.nll_loss(model(data).float(), target)
                scaler.scale(loss).backward()
                optimizer.synchronize()              # Horovod's AMP pattern
                scaler.unscale_(optimizer)
                with optimizer.skip_synchronize():
                    scaler.step(optimizer)
                scaler.update()
            train_losses.append(loss.item())
            if batch_idx % args.log_interval == 0 and hvd.rank() == 0:
                print(f"Train Epoch: {epoch} [{batch_idx * len(data)}/{len(train_sampler)}]"
                      f"\tLoss: {loss.item():.6f}")

    def metric_average(val, name):
        return hvd.allreduce(torch.tensor(val), name=name).item()

    def test():
        model.eval()
        test_loss, test_accuracy = 0.0, 0.0
        with torch.no_grad():
            for data, target in test_loader:
                data, target = data.to(device), target.to(device)
                output = model(data)
                test_loss += F.nll_loss(output, target, reduction="sum").item()
                test_accuracy += output.argmax(1).eq(target).float().sum().item()
        test_loss = metric_average(test_loss / len(test_sampler), "avg_loss")
        test_accuracy = metric_average(test_accuracy / len(test_sampler), "avg_accuracy")
        if hvd.rank() == 0:
            print(f"Test set: Average loss: {test_loss:.4f}, Accuracy: {100 * test_accuracy:.2f}%")
        return test_loss, test_accuracy

    loss_before, _ = test()
    for epoch in range(1, args.epochs + 1):
        train_epoch(epoch)
        loss_after, accuracy = test()
    print_result("mnist", model, steps=len(train_losses), test_loss_before=loss_before,
                 test_loss_after=loss_after, test_accuracy=accuracy,
                 train_loss_first=train_losses[0], train_loss_last=train_losses[-1])


if __name__ == "__main__":
    main(parser.parse_args())
