"""Load a benchmark script (benchmarks/NAME.py) as a module, for tests that run its code
dry on CPU tensors. benchmarks/ goes on sys.path for the scripts' own imports (timing)."""
import importlib.util
import sys
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def load_benchmark(name: str, as_name: str | None = None):
    """benchmarks/``name``.py, executed as a fresh module named ``as_name``."""
    if str(BENCHMARKS) not in sys.path:
        sys.path.insert(0, str(BENCHMARKS))
    spec = importlib.util.spec_from_file_location(as_name or f"bench_{name}",
                                                  BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
