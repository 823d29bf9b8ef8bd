"""How often Horovod's background thread wakes up: ``HOROVOD_CYCLE_TIME``, chosen before
``hvd.init()``.

Horovod's background thread runs a negotiation cycle every ``HOROVOD_CYCLE_TIME`` ms
(default 1 ms), busy or idle, and with Gloo every cycle is a small exchange with the other
ranks. Where every core already runs a training rank, those thousand wake-ups a second
per rank take CPU from forward, backward and compression: on the LSTM benchmark (2 ranks
on 2 cores, 1 Gbit/s) rank 0's forward + backward took 108 ms at 1 ms and 78 ms at 5 ms
(as alone), and a static Top-k 40x step went 202 -> 145-153 ms (docs/notes/2026-11-benchmarks.md §4).
A longer cycle delays each collective by up to one cycle; gravac issues one or two
rounds of collectives per step, so a few ms of latency buy back tens of ms of CPU.

``resolve_cycle_time(setting)``:

* a number: that many ms (the config says so; it overrides the environment);
* ``"auto"`` (the default): the environment's ``HOROVOD_CYCLE_TIME`` if the user set one;
  else ``CROWDED_CYCLE_MS`` when this host's ranks cannot each have two cores (the rank
  and Horovod's thread), else Horovod's own default (nothing set);
* ``"horovod"``: never touch it (Horovod's default or the environment's).

Example::

    value, why = resolve_cycle_time("auto", {"HOROVOD_LOCAL_SIZE": "2"}, cpu_count=2)
    # ("5", "auto: 2 ranks on 2 cores")
"""
from __future__ import annotations

import os
from typing import Mapping

ENV = "HOROVOD_CYCLE_TIME"
#: The cycle "auto" picks on a crowded host (measured: 2 ms still cost ~5% of the step on
#: the LSTM benchmark, 20 ms added more latency than it saved).
CROWDED_CYCLE_MS = 5.0


PROBLEM = "must be 'auto', 'horovod' or a number of milliseconds > 0 (Horovod's default is 1)"


def check_setting(setting) -> None:
    """ValueError unless ``setting`` is "auto", "horovod" or a finite number of ms > 0."""
    if isinstance(setting, str) and setting in ("auto", "horovod"):
        return
    if isinstance(setting, bool) or not isinstance(setting, (int, float)) \
            or not 0 < setting < float("inf"):
        raise ValueError(f"horovod_cycle_time_ms={setting!r}: {PROBLEM}")


def resolve_cycle_time(setting="auto", environ: Mapping[str, str] | None = None,
                       cpu_count: int | None = None) -> tuple[str | None, str]:
    """(value for ``HOROVOD_CYCLE_TIME`` or None to leave it, a short reason)."""
    check_setting(setting)
    env = os.environ if environ is None else environ
    if setting == "horovod":
        return None, "Horovod's setting"
    if setting != "auto":
        return f"{float(setting):g}", "run.horovod_cycle_time_ms"
    if env.get(ENV):
        return None, f"{ENV} from the environment"
    cores = cpu_count if cpu_count is not None else (os.cpu_count() or 1)
    local = _local_size(env)
    if local is not None and 2 * local > cores:
        return f"{CROWDED_CYCLE_MS:g}", f"auto: {local} ranks on {cores} cores"
    return None, "Horovod's default"


def apply_cycle_time(setting="auto") -> tuple[str | None, str]:
    """Set ``HOROVOD_CYCLE_TIME`` in this process's environment as ``resolve_cycle_time``
    says (before ``hvd.init()``); returns what it resolved."""
    value, why = resolve_cycle_time(setting)
    if value is not None:
        os.environ[ENV] = value
    return value, why


def _local_size(env: Mapping[str, str]) -> int | None:
    # horovodrun (Gloo) and mpirun (Open MPI) tell each process how many share its host.
    for key in ("HOROVOD_LOCAL_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE"):
        value = env.get(key, "")
        if value.isdigit() and int(value) > 0:
            return int(value)
    return None
