"""gravac's Triton kernels in Triton's CPU interpreter.

``TRITON_INTERPRET=1`` must be set before Triton is first imported: Triton's own library
functions (``tl.sum``, ``tl.cumsum``) are decorated at its import, compiled or
interpreted for good. So these tests run in a process of their own (tests/run.sh runs
``pytest tests/triton`` apart from tests/unit), and this file sets the variable when
pytest loads it, before any test module imports Triton.
"""
import os

os.environ["TRITON_INTERPRET"] = "1"
