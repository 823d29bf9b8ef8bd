"""Shared test set-up: one CPU thread per process (two ranks share two cores); tests/ on
sys.path for the small helpers (tiny_data)."""
import sys
from pathlib import Path

import torch

torch.set_num_threads(1)

sys.path.insert(0, str(Path(__file__).parent))
