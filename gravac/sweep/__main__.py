"""``python -m gravac.sweep SWEEP_FILE ...``: see gravac/sweep/__init__.py."""
import sys

from .runner import main

sys.exit(main())
