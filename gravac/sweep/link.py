"""The link a sweep's runs cross: this host's loopback, or a rate-limited one.

Gradient compression buys time only where the exchange is slow. Between ranks on one
machine the exchange crosses loopback, which no real link is as fast as, so a sweep there
shows every compressor's cost and none of its gain. A sweep file's ``link: RATE`` (or
``--link RATE``) runs each job inside ``hvd_scripts/bandwidth_sandbox.sh RATE`` (a network
namespace whose loopback a token bucket limits to RATE): the traffic then crosses a link
of that speed. That needs root (network namespaces, tc); elsewhere the runs go over the
plain loopback, and the sweep says so where it starts and in its results.

Example::

    plan = link_plan("100mbit")
    plan.prefix        # ['bash', 'hvd_scripts/bandwidth_sandbox.sh', '100mbit', '--'] as root
    plan.description   # '100mbit (hvd_scripts/bandwidth_sandbox.sh)'
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass

from .errors import SweepError

#: tc's rate spellings that hvd_scripts/bandwidth_sandbox.sh takes (e.g. 100mbit, 1gbit),
#: and each unit in bit/s.
RATE_UNITS = {"kbit": 1e3, "mbit": 1e6, "gbit": 1e9}
RATE = re.compile(r"^(\d+(?:\.\d+)?)(kbit|mbit|gbit)$")
SANDBOX = "hvd_scripts/bandwidth_sandbox.sh"
#: The plain loopback, said where a sweep starts and in its results.
LOOPBACK = ("loopback (no rate limit): nothing limits the exchange, so compression can "
            "only cost time here; a method that adapts (controller: auto) should settle on "
            "dense")


@dataclass(frozen=True)
class LinkPlan:
    """What the runs cross: the command prefix that limits the link (empty for loopback)
    and a line saying which link it is."""

    prefix: tuple[str, ...]
    description: str

    @property
    def limited(self) -> bool:
        return bool(self.prefix)


def check_rate(field_name: str, rate) -> str | None:
    """``rate`` as a sweep file or ``--link`` gives it: None/"none"/"loopback" (the plain
    loopback) or a tc rate such as 100mbit; anything else is refused in one line."""
    if rate is None or (isinstance(rate, str) and rate.strip().lower() in ("none", "loopback")):
        return None
    text = str(rate).strip().lower()
    if not RATE.match(text):
        raise SweepError(f"{field_name}: {rate!r} is not a link rate; write it as tc does "
                         f"(e.g. 100mbit, 1gbit, 10gbit) or none for the plain loopback")
    return text


def bits_per_second(rate: str) -> float:
    """A tc rate in bit/s (``"100mbit"`` -> 1e8); ValueError, for the caller to name its
    option, for anything else or a rate of 0."""
    m = RATE.match(str(rate).strip().lower())
    if not m or float(m.group(1)) == 0:
        raise ValueError(f"{rate!r} not understood; use e.g. 100mbit, 1gbit, 10gbit, or none "
                         "for the host's plain loopback")
    return float(m.group(1)) * RATE_UNITS[m.group(2)]


def can_limit() -> str | None:
    """None when this process can run the sandbox, else why not (one phrase)."""
    if os.name != "posix" or os.geteuid() != 0:
        return "it needs root (network namespaces and tc)"
    missing = [tool for tool in ("ip", "tc") if shutil.which(tool) is None]
    if missing:
        return f"{' and '.join(missing)} not found (iproute2)"
    return namespace_refusal()


def namespace_refusal() -> str | None:
    """None when a network namespace can be made here (one is made and removed), else why
    not: root in a container may still be refused them. The sandboxes' one probe (also
    tests/cluster's)."""
    name = f"gravac-probe-{os.getpid()}"
    made = subprocess.run(["ip", "netns", "add", name], capture_output=True, text=True)
    if made.returncode != 0:
        return ("cannot create a network namespace here: "
                f"{made.stderr.strip() or 'ip netns add failed'}")
    subprocess.run(["ip", "netns", "del", name], capture_output=True)
    return None


def link_plan(rate: str | None, why_not: str | None = None) -> LinkPlan:
    """The plan for ``rate`` (``check_rate``'s result) on this machine; ``why_not`` is
    ``can_limit()``'s answer (given by tests)."""
    if rate is None:
        return LinkPlan((), LOOPBACK)
    if why_not is None:
        why_not = can_limit()
    if why_not is not None:
        return LinkPlan((), f"{LOOPBACK} ({rate} was asked, but {SANDBOX} could not run: "
                            f"{why_not})")
    return LinkPlan(("bash", SANDBOX, rate, "--"), f"{rate} ({SANDBOX})")
