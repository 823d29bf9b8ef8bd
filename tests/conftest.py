"""Shared test set-up: one CPU thread per process (two ranks share two cores)."""
import torch

torch.set_num_threads(1)
