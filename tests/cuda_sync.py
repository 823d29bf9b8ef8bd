"""torch's sync debug mode in the GPU tests: which of its warnings name a host sync."""


def is_sync_warning(w) -> bool:
    """A warning of ``torch.cuda.set_sync_debug_mode("warn")`` about a synchronising call;
    not the notice, given once per process when the mode is first set, that the mode is a
    prototype (seen on an H200: it was counted as a sync of the first test that set it)."""
    text = str(w.message)
    return "synchroniz" in text and "prototype" not in text
