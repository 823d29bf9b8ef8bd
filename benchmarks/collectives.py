"""Time gravac's own collectives (``gravac.comm``) on the ranks of a launch: the
measurements ``benchmarks/scaling.py calibrate`` fits the α-β links of the cost model to.

Runs as every rank's program under a launcher (horovodrun or torchrun; one process alone
works too, and measures nothing but call overhead). For each group of ranks the step
engine uses, each collective and each size it times ``--repeats`` calls after one
warm-up call, takes per call the slowest rank, and writes the median (rank 0 writes the
JSON). Groups:

* ``world``: every rank (dense allreduce, allgather, shared_index, PowerSGD, gains);
* ``host``: the ranks of one host, every host at once (the hierarchical exchange's host
  average and host share: the "local" link); only with 2+ hosts of 2+ ranks (on one
  host the world group is the host group);
* ``leaders``: the lowest rank of each host (the hierarchical exchange's sparse allgather
  over the "inter" link); only with 2+ hosts of 2+ ranks.

Collectives: ``comm.allreduce`` (average, fp32), ``comm.grouped_allreduce_async_`` (two
fp32 tensors of half the size each: the dense exchange's fused call),
``comm.allgather_bytes(same_size=True)`` (uint8; the size is the gathered total, each rank
contributes 1/ranks of it) and ``comm.broadcast_`` (fp32, root 0). Sizes go from
``--min-bytes`` (8) to ``--max-bytes`` (32M) by factors of ``--factor`` (4).

Examples (run from the repository root; the sandboxes need root)::

    # 2 ranks on one host whose loopback is limited to 1 Gbit/s (both directions share it)
    sudo hvd_scripts/bandwidth_sandbox.sh 1gbit -- .venv/bin/horovodrun -np 2 \\
        -H localhost:2 --gloo .venv/bin/python benchmarks/collectives.py \\
        --link 1gbit --out runs/scaling/collectives_1x2_1gbit.json
    # 2 hosts x 2 ranks joined at 1 Gbit/s each way
    sudo hvd_scripts/cluster_sandbox.sh --hosts 2 --slots 2 --link 1gbit -- bash -c \\
        '.venv/bin/horovodrun -np 4 -H h0:2,h1:2 --gloo --network-interfaces eth0 \\
         -p "$GRAVAC_SSH_PORT" -i "$GRAVAC_SSH_KEY" \\
         $PWD/.venv/bin/python $PWD/benchmarks/collectives.py --link 1gbit \\
         --out $PWD/runs/scaling/collectives_2x2_1gbit.json'

Horovod's background cycle is chosen as the trainer chooses it (``gravac.comm.init``:
5 ms where a host's ranks crowd its cores), so the latencies measured are the ones a
training step sees.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

OPS = ("allreduce", "grouped_allreduce", "allgather", "broadcast")
GROUPS = ("world", "host", "leaders")
KIND = "gravac.scaling.collectives"


class _OneLineParser(argparse.ArgumentParser):
    """argparse that reports bad input in one line naming the argument."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message}\n")


def parse_bytes(text: str) -> int:
    """``"8"``, ``"4K"``, ``"32M"``, ``"1G"`` (binary multiples) -> bytes.

    >>> parse_bytes("32M"), parse_bytes("8")
    (33554432, 8)
    """
    text = str(text).strip()
    scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:].upper(), 1)
    number = text[:-1] if scale > 1 else text
    try:
        value = int(float(number) * scale)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size (e.g. 8, 4K, 32M)") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: a size must be at least 1 byte")
    return value


def sizes(min_bytes: int, max_bytes: int, factor: int) -> list[int]:
    """Geometric sizes from min to max (max always included).

    >>> sizes(8, 100, 4)
    [8, 32, 100]
    """
    out, b = [], min_bytes
    while b < max_bytes:
        out.append(b)
        b *= factor
    out.append(max_bytes)
    return out


def host_layout(nodes: list[int]) -> list[list[int]]:
    """Ranks per host, hosts ordered by their lowest rank (as the hierarchical exchange).

    >>> host_layout([0, 0, 1, 1])
    [[0, 1], [2, 3]]
    """
    groups: dict = {}
    for rank, node in enumerate(nodes):
        groups.setdefault(node, []).append(rank)
    return sorted(groups.values(), key=lambda ranks: ranks[0])


def _call(comm, op: str, nbytes: int, name: str):
    """A closure running one ``op`` of ``nbytes`` on ``comm`` (buffers made once)."""
    import torch

    if op == "allgather":
        each = max(1, nbytes // comm.size)
        buf = torch.zeros(each, dtype=torch.uint8)
        return (lambda: comm.allgather_bytes(buf, name=name, same_size=True)), each
    floats = max(2, nbytes // 4)
    if op == "allreduce":
        t = torch.ones(floats)
        return (lambda: comm.allreduce(t, op="average", name=name)), floats * 4
    if op == "grouped_allreduce":
        half = max(1, floats // 2)
        parts = [torch.ones(half), torch.ones(floats - half)]
        return (lambda: comm.grouped_allreduce_async_(parts, op="average", name=name).wait()), \
            floats * 4
    t = torch.ones(floats)
    return (lambda: comm.broadcast_(t, root=0, name=name)), floats * 4


def time_op(comm, op: str, nbytes: int, repeats: int, name: str) -> tuple[int, list[float]]:
    """(bytes as the cost model counts them, this rank's seconds per call). One warm-up
    call, a barrier, then ``repeats`` calls back to back (each waits for the slowest rank
    of the previous one, as steps do)."""
    fn, counted = _call(comm, op, nbytes, name)
    fn()
    comm.barrier(name=f"{name}.barrier")
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
    return counted, samples


def measure_group(comm, label: str, ops, byte_sizes, repeats) -> dict:
    """{op: [(bytes, samples)]} for this rank's member Comm of a group."""
    out = {}
    for op in ops:
        rows = []
        for nbytes in byte_sizes:
            counted, samples = time_op(comm, op, nbytes, repeats, f"scal.{label}.{op}.{nbytes}")
            rows.append((counted, samples))
        out[op] = rows
    return out


def merge(per_rank: list[dict], repeats: int) -> dict:
    """Per group, op and size: per call the slowest rank (over every instance of the group:
    all hosts run their host group at once), then the median over calls."""
    merged: dict = {}
    for rank_result in per_rank:
        for label, ops in rank_result.items():
            g = merged.setdefault(label, {})
            for op, rows in ops.items():
                slots = g.setdefault(op, {})
                for counted, samples in rows:
                    worst = slots.setdefault(counted, [0.0] * repeats)
                    for i, s in enumerate(samples):
                        worst[i] = max(worst[i], s)
    return {label: {op: [{"bytes": b, "median_s": statistics.median(v), "samples_s": v}
                         for b, v in sorted(rows.items())]
                    for op, rows in ops.items()}
            for label, ops in merged.items()}


def main(argv=None) -> int:
    parser = _OneLineParser(prog="collectives.py", description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="JSON written by rank 0")
    parser.add_argument("--link", default="unknown",
                        help="the link's rate as the sandbox was told (e.g. 1gbit); a label")
    parser.add_argument("--label", default="", help="free text kept in the JSON")
    parser.add_argument("--min-bytes", type=parse_bytes, default=8)
    parser.add_argument("--max-bytes", type=parse_bytes, default=32 << 20)
    parser.add_argument("--factor", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--ops", nargs="+", default=list(OPS), choices=OPS)
    parser.add_argument("--groups", nargs="+", default=list(GROUPS), choices=GROUPS)
    parser.add_argument("--backend", default="auto", choices=("auto", "horovod", "torch", "local"))
    parser.add_argument("--threads", type=int, default=None,
                        help="torch threads per rank (default: cores / ranks on the host, "
                             "as train.py)")
    args = parser.parse_args(argv)
    if args.factor < 2:
        parser.error(f"argument --factor: must be >= 2, got {args.factor}")
    if args.repeats < 1:
        parser.error(f"argument --repeats: must be >= 1, got {args.repeats}")
    if args.max_bytes < args.min_bytes:
        parser.error(f"argument --max-bytes: {args.max_bytes} is below --min-bytes "
                     f"{args.min_bytes}")

    # Host groups are Horovod process sets made at run time (as the hierarchical exchange).
    os.environ.setdefault("HOROVOD_DYNAMIC_PROCESS_SETS", "1")
    import torch

    import gravac.comm

    comm = gravac.comm.init(args.backend)
    torch.set_num_threads(args.threads or max(1, (os.cpu_count() or 1) // max(1, comm.local_size)))
    nodes = comm.allgather_object(comm.node, name="scal.nodes")
    hosts = host_layout(nodes)
    slots = sorted({len(h) for h in hosts})
    if len(slots) > 1:
        print(f"collectives.py: hosts hold different numbers of ranks ({hosts}); the cost "
              "model needs the same slots on every host", file=sys.stderr)
        return 2
    n_hosts, n_slots = len(hosts), slots[0]
    byte_sizes = sizes(args.min_bytes, args.max_bytes, args.factor)

    # Every rank makes every sub-group, in the same order (a collective on all ranks).
    members: dict[str, object] = {"world": comm}
    # One host: its group is the world, already measured (scope "local").
    measured = {"world": True, "host": n_hosts > 1 and n_slots > 1,
                "leaders": n_hosts > 1 and n_slots > 1}
    if "host" in args.groups and measured["host"]:
        for k, ranks in enumerate(hosts):
            sub = comm.subgroup(ranks, name=f"scal.host{k}")
            if sub is not None:
                members["host"] = sub
    if "leaders" in args.groups and measured["leaders"]:
        sub = comm.subgroup([h[0] for h in hosts], name="scal.leaders")
        if sub is not None:
            members["leaders"] = sub

    started = time.time()
    mine: dict = {}
    for label in GROUPS:
        if label not in args.groups or not measured[label]:
            continue
        if label in members:
            mine[label] = measure_group(members[label], label, args.ops, byte_sizes, args.repeats)
        comm.barrier(name=f"scal.{label}.done")    # non-members wait here
        if comm.rank == 0:
            print(f"[collectives] {label}: done after {time.time() - started:.0f}s", flush=True)
    per_rank = comm.allgather_object(mine, name="scal.results")
    if comm.rank == 0:
        merged = merge(per_rank, args.repeats)
        sizes_of = {"world": comm.size, "host": n_slots, "leaders": n_hosts}
        scope_of = {"world": "inter" if n_hosts > 1 else "local", "host": "local",
                    "leaders": "inter"}
        result = {
            "kind": KIND, "backend": comm.backend, "n": comm.size, "hosts": n_hosts,
            "slots": n_slots, "link": args.link, "label": args.label,
            "horovod_cycle_time_ms": os.environ.get("HOROVOD_CYCLE_TIME"),
            "threads": torch.get_num_threads(), "cores": os.cpu_count(),
            "machine": platform.node(), "torch": torch.__version__, "repeats": args.repeats,
            "seconds": time.time() - started, "command": " ".join(sys.argv),
            "groups": {label: {"ranks": sizes_of[label], "scope": scope_of[label],
                               "instances": n_hosts if label == "host" else 1, "ops": ops}
                       for label, ops in merged.items()},
        }
        args.out.parent.mkdir(parents=True, exist_ok=True)
        tmp = args.out.with_suffix(args.out.suffix + ".tmp")
        tmp.write_text(json.dumps(result, indent=1) + "\n")
        tmp.replace(args.out)
        print(f"[collectives] {comm.size} ranks ({n_hosts} hosts x {n_slots}), backend "
              f"{comm.backend}: {args.out}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
