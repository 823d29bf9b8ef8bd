"""How a process that ran gloo collectives ends: without the interpreter's finalization.

Gloo runs each collective on a worker thread of its process group. After the caller has
seen a collective finish, that thread still drops its references to the collective's
tensors, and with PyTorch's tensors that can need the GIL. ``destroy_process_group``
does not stop gloo's threads (gloo has no shutdown). A rank that reaches the end of its
script within that moment begins finalization first; Python 3.11 then ends the thread
that asks for the GIL inside a C++ destructor: ``std::terminate``, SIGABRT, and the
launcher reports the job failed after all its work was done. Seen as "terminate called
without an active exception" on about 1 run in 10 of the four-rank torchrun cluster test
on a loaded machine; the core's stack was ``ProcessGroupGloo::AsyncWork::~AsyncWork`` ->
``TensorImpl::decref_pyobject`` -> ``take_gil`` -> ``pthread_exit``.

``end_process`` is for a process's entry point, once every rank has finished its
collectives (``TorchDistComm.close``: a barrier, then the group destroyed) and the run's
files are closed: a rank that leaves in the middle of a collective fails its peers'.

Example::

    if __name__ == "__main__":
        end_process(main())         # main() closes its Comm before it returns
"""
from __future__ import annotations

import os
import sys
from typing import NoReturn

_gloo_ran = False


def note_gloo() -> None:
    """Called by ``TorchDistComm`` on a gloo group: this process must end by ``end_process``'s
    hard exit."""
    global _gloo_ran
    _gloo_ran = True


def end_process(code: int) -> NoReturn:
    """Exit with status ``code``: ``sys.exit`` in a process that ran no gloo group; else
    stdout and stderr are flushed and the process ends at once (``os._exit``), without
    finalization (atexit handlers do not run)."""
    if not _gloo_ran:
        sys.exit(code)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (AttributeError, OSError, ValueError):   # closed or replaced streams
            pass
    os._exit(code)
