"""Load a benchmark (the script benchmarks/NAME.py, or the package benchmarks/NAME/) as a
module, for tests that run its code dry on CPU tensors. benchmarks/ goes on sys.path for the
scripts' own imports (timing); the repository root for the packages, which import
themselves and the scripts beside them as ``benchmarks.*``."""
import importlib
import importlib.util
import sys
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
REPO = BENCHMARKS.parent


def load_benchmark(name: str, as_name: str | None = None):
    """benchmarks/``name``.py, executed as a fresh module named ``as_name``; a package
    benchmarks/``name``/ is imported as ``benchmarks.name`` (one module per process: its
    modules import each other by that name, so it takes no ``as_name``).

    Example::

        bench = load_benchmark("compressors")          # benchmarks/compressors.py
        S = load_benchmark("scaling")                   # the package benchmarks/scaling/
    """
    if (BENCHMARKS / name).is_dir():
        if as_name is not None:
            raise ValueError(f"benchmarks/{name}/ is a package: it loads as "
                             f"benchmarks.{name} only, not as {as_name!r}")
        if str(REPO) not in sys.path:
            sys.path.insert(0, str(REPO))
        return importlib.import_module(f"benchmarks.{name}")
    if str(BENCHMARKS) not in sys.path:
        sys.path.insert(0, str(BENCHMARKS))
    spec = importlib.util.spec_from_file_location(as_name or f"bench_{name}",
                                                  BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    # registered before it runs, as an import does: dataclasses look their module up there
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module
