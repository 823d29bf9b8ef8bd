"""Time gravac's own collectives (``gravac.comm``) on the ranks of a launch: the
measurements ``benchmarks/scaling calibrate`` fits the α-β links of the cost model to.

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
contributes 1/ranks of it), ``comm.broadcast_`` (fp32, root 0) and ``comm.allreduce`` of
fp16 (``allreduce_fp16``: Horovod's fp16 compression, summed in half precision on the
CPU). Sizes go from ``--min-bytes`` (8) to ``--max-bytes`` (32M) by factors of
``--factor`` (4).

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

Last, the **lockstep** measurement (``--lockstep-ms``, ``measure_lockstep``): every rank
does W ms of CPU work (compute-bound "gemm" and memory-bound "stream", W as each rank timed
it alone) and then a 4-byte allreduce, as a training step does its compute and local
compression before a collective. With more ranks than cores such a step takes more than W:
the cores are shared, the ranks finish at different moments and the collective waits for
the last, background threads (Horovod's cycle, Gloo, the sandbox's network) take their
share. ``benchmarks/scaling calibrate`` fits step = sync + factor·W per kind of work, and
``validate`` stretches compute and local work by these factors instead of assuming
ranks/cores. A third kind, "stream_solo", has one rank per step do the work while the
others wait: how fast the shared_index exchange's leader selects for everyone.

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

OPS = ("allreduce", "grouped_allreduce", "allgather", "broadcast", "allreduce_fp16")
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
    if op == "allreduce_fp16":               # Horovod's fp16 compression: a half allreduce
        halves = max(2, nbytes // 2)
        h = torch.ones(halves, dtype=torch.float16)
        return (lambda: comm.allreduce(h, op="average", name=name)), halves * 2
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


# -- lockstep: CPU work between collectives, as a training step does ----------------------------
#: Work kinds: "gemm" is compute-bound like forward/backward, "stream" memory-bound like the
#: selection, error feedback and unpacking of gravac's local work. "stream_solo" is the
#: stream work done by ONE rank per step (rank step mod N) while the others wait in the
#: collective: the shared_index exchange's leader selecting for everyone.
WORK_KINDS = ("gemm", "stream", "stream_solo")


def _works(kind: str, rank: int, size: int, step: int) -> bool:
    """Whether ``rank`` does the step's work (every rank, but one per step for a solo kind)."""
    return not kind.endswith("_solo") or step % size == rank


def _work_unit(kind: str):
    """One unit of CPU work of ``kind`` (about a millisecond alone on this machine)."""
    import torch

    kind = kind.removesuffix("_solo")
    if kind == "gemm":
        a, b = torch.rand(160, 160), torch.rand(160, 160)
        out = torch.empty(160, 160)
        return lambda: torch.mm(a, b, out=out)
    src, dst = torch.rand(1 << 19), torch.empty(1 << 19)     # 2 MiB each: past the caches
    return lambda: dst.copy_(src).mul_(1.0001)


def _unit_seconds(unit, seconds: float = 0.3) -> float:
    """Median seconds of one unit, from batches filling about ``seconds``."""
    unit()
    t0, count = time.perf_counter(), 0
    while time.perf_counter() - t0 < 0.05:
        unit()
        count += 1
    batch = max(1, int(count * seconds / 0.05 / 5))
    samples = []
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(batch):
            unit()
        samples.append((time.perf_counter() - t0) / batch)
    return statistics.median(samples)


def measure_lockstep(comm, works_ms, repeats: int, kinds=WORK_KINDS) -> dict:
    """Steps of W ms of CPU work (W as timed alone) followed by a 4-byte allreduce, every
    rank at once: what one step's CPU phase costs in this layout. Returns, per kind and W,
    this rank's seconds per step and of its own work inside the step (None for the steps
    of a solo kind where another rank worked).

    Each rank first times one unit of work while the others wait in a barrier (alone on
    the machine but for idle ranks), so W means the same work on every rank. With more
    ranks than cores a step takes more than W: the cores are shared (about ranks/cores),
    the ranks finish their work at different moments and the collective waits for the
    last (skew), and background threads (Horovod's cycle, Gloo, the sandbox's network)
    take their share. ``benchmarks/scaling calibrate`` fits step = sync + factor·W."""
    import torch

    flag = torch.zeros(1)
    out = {}
    for kind in kinds:
        unit = _work_unit(kind)
        alone = None
        for r in range(comm.size):
            if comm.rank == r:
                alone = _unit_seconds(unit)
            comm.barrier(name=f"scal.lockstep.{kind}.alone{r}")
        rows = []
        for w_ms in works_ms:
            units = int(round(w_ms / 1e3 / alone))
            comm.allreduce(flag, op="sum", name=f"scal.lockstep.{kind}.{w_ms}.warm")
            steps, own = [], []
            for i in range(repeats):
                works = _works(kind, comm.rank, comm.size, i)
                t0 = time.perf_counter()
                for _ in range(units if works else 0):
                    unit()
                t1 = time.perf_counter()
                comm.allreduce(flag, op="sum", name=f"scal.lockstep.{kind}.{w_ms}.{i}")
                steps.append(time.perf_counter() - t0)
                own.append(t1 - t0 if works else None)
            rows.append({"work_s": units * alone, "steps_s": steps, "own_s": own})
        out[kind] = {"unit_s": alone, "rows": rows}
    return out


def _wait_mode(backend: str) -> str | None:
    """How this process's Horovod collectives waited ("sleep" / "spin"); None off Horovod."""
    if backend != "horovod":
        return None
    from gravac.comm.horovod import wait_mode
    return wait_mode()[0]


def merge_lockstep(per_rank: list[dict]) -> dict:
    """Per kind and W: the median over steps of the slowest rank's step (all ranks leave a
    step's allreduce together, so their step times differ by the release only) and the
    median over steps and ranks of the rank's own work (the working rank's, for a solo
    kind)."""
    merged = {}
    for kind in per_rank[0]:
        rows = []
        for i, row in enumerate(per_rank[0][kind]["rows"]):
            ranks = [r[kind]["rows"][i] for r in per_rank]
            steps = [max(vals) for vals in zip(*(r["steps_s"] for r in ranks))]
            own = [v for r in ranks for v in r["own_s"] if v is not None]
            rows.append({"work_s": statistics.median(r["work_s"] for r in ranks),
                         "step_s": statistics.median(steps),
                         "own_s": statistics.median(own)})
        merged[kind] = {"unit_s": [r[kind]["unit_s"] for r in per_rank], "rows": rows}
    return merged


def main(argv=None, prog: str = "collectives.py") -> int:
    """``prog``: the name --help and errors give the command (``benchmarks/scaling
    measure-collectives`` runs this too)."""
    parser = _OneLineParser(prog=prog, description=" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument("--out", type=Path, required=True, help="JSON written by rank 0")
    parser.add_argument("--link", default="unknown",
                        help="the link's rate as the sandbox was told (e.g. 1gbit); a label")
    parser.add_argument("--label", default="", help="free text kept in the JSON")
    parser.add_argument("--min-bytes", type=parse_bytes, default=8)
    parser.add_argument("--max-bytes", type=parse_bytes, default=32 << 20)
    parser.add_argument("--factor", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--ops", nargs="+", default=list(OPS), choices=OPS)
    parser.add_argument("--groups", nargs="*", default=list(GROUPS), choices=GROUPS,
                        help="groups whose collectives are timed; none: the lockstep only")
    parser.add_argument("--lockstep-ms", type=float, nargs="*",
                        default=[0, 50, 100, 150, 200],
                        help="CPU work per step (ms, as timed alone) of the lockstep "
                             "measurement; none to skip it")
    parser.add_argument("--lockstep-repeats", type=int, default=16)
    parser.add_argument("--backend", default="auto", choices=("auto", "horovod", "torch", "local"))
    parser.add_argument("--horovod-wait", default="auto", choices=("auto", "sleep", "spin"),
                        help="how the ranks wait for a Horovod collective (run.horovod_wait): "
                             "spin is plain Horovod's own loop, what hvd.DistributedOptimizer "
                             "does; auto as the trainer chooses")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch threads per rank (default: cores / ranks on the host, "
                             "as train.py)")
    args = parser.parse_args(argv)
    if args.factor < 2:
        parser.error(f"argument --factor: must be >= 2, got {args.factor}")
    if args.repeats < 1:
        parser.error(f"argument --repeats: must be >= 1, got {args.repeats}")
    if args.lockstep_repeats < 1:
        parser.error(f"argument --lockstep-repeats: must be >= 1, got {args.lockstep_repeats}")
    if any(not w >= 0 for w in args.lockstep_ms):
        parser.error(f"argument --lockstep-ms: must be >= 0, got {args.lockstep_ms}")
    if args.max_bytes < args.min_bytes:
        parser.error(f"argument --max-bytes: {args.max_bytes} is below --min-bytes "
                     f"{args.min_bytes}")

    # Host groups are Horovod process sets made at run time (as the hierarchical exchange).
    os.environ.setdefault("HOROVOD_DYNAMIC_PROCESS_SETS", "1")
    import torch

    import gravac.comm

    comm = gravac.comm.init(args.backend, horovod_wait=args.horovod_wait)
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
    lockstep = measure_lockstep(comm, args.lockstep_ms, args.lockstep_repeats) \
        if args.lockstep_ms else None
    if comm.rank == 0 and lockstep is not None:
        print(f"[collectives] lockstep: done after {time.time() - started:.0f}s", flush=True)
    per_rank = comm.allgather_object(mine, name="scal.results")
    per_rank_lockstep = comm.allgather_object(lockstep, name="scal.lockstep.results")
    if comm.rank == 0:
        merged = merge(per_rank, args.repeats)
        sizes_of = {"world": comm.size, "host": n_slots, "leaders": n_hosts}
        scope_of = {"world": "inter" if n_hosts > 1 else "local", "host": "local",
                    "leaders": "inter"}
        result = {
            "kind": KIND, "backend": comm.backend, "n": comm.size, "hosts": n_hosts,
            "slots": n_slots, "link": args.link, "label": args.label,
            "horovod_cycle_time_ms": os.environ.get("HOROVOD_CYCLE_TIME"),
            "horovod_wait": _wait_mode(comm.backend),
            "threads": torch.get_num_threads(), "cores": os.cpu_count(),
            "machine": platform.node(), "torch": torch.__version__, "repeats": args.repeats,
            "seconds": time.time() - started, "command": " ".join(sys.argv),
            "groups": {label: {"ranks": sizes_of[label], "scope": scope_of[label],
                               "instances": n_hosts if label == "host" else 1, "ops": ops}
                       for label, ops in merged.items()},
        }
        if lockstep is not None:
            result["lockstep"] = merge_lockstep(per_rank_lockstep)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        tmp = args.out.with_suffix(args.out.suffix + ".tmp")
        tmp.write_text(json.dumps(result, indent=1) + "\n")
        tmp.replace(args.out)
        print(f"[collectives] {comm.size} ranks ({n_hosts} hosts x {n_slots}), backend "
              f"{comm.backend}: {args.out}", flush=True)
    comm.close()            # every rank's collectives over before any rank exits
    return 0


if __name__ == "__main__":
    code = main()
    from gravac.comm import end_process   # after gloo, no finalization: process_exit.py

    end_process(code)
