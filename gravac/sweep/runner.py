"""Running a sweep: validate every run first, then launch them one after another under
horovodrun or torchrun, keeping the results files current; the command line."""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable, Sequence

import yaml

from ..report import METRICS_FILE, load_run
from ..train.resume import occupied
from ..util import job
from ..util.atomic import atomic_write_text
from .errors import SweepError, problem_lines
from .link import LinkPlan, check_rate, link_plan
from .results import (fastest_line, finished, report_groups, results_rows,
                      write_results)
from .spec import (REPO, RunSpec, Sweep, check_key, expand, load_sweep,
                   pick_baselines)


def resolve_configs(runs: Sequence[RunSpec], sweep_dir: Path, extra: Sequence[tuple[str, Any]],
                    repo: Path = REPO, launcher: str | None = None
                    ) -> tuple[dict[str, Any], list[tuple[str, str]]]:
    """Load every run's config in this process (fast, no model built), and check it against
    ``launcher`` (``"horovodrun"``, ``"torchrun"``; None: not) as train.py will under it.

    Returns (run name -> resolved ``Config``, [(run name, "config error: ...") for bad runs]).
    """
    from gravac.train.config import ConfigError, check_launcher, load_config

    configs, errors = {}, []
    for run in runs:
        files = [str(repo / f) for f in run.files]
        args = run.train_args(sweep_dir, extra)
        sets = [args[i + 1] for i, a in enumerate(args) if a == "--set"]
        try:
            cfg = load_config(files, sets)
            check_launcher(cfg, environ={}, launcher=launcher)
            configs[run.name] = cfg
        except ConfigError as exc:
            errors.append((run.name, f"config error: {exc}"))
    return configs, errors


def dry_run_check(train_args: list[str], repo: Path = REPO, timeout: float = 600) -> str | None:
    """``python train.py ARGS --dry-run`` (no horovodrun): None if it passes, else the error.

    Example::

        dry_run_check(["--config", "configs/demo.yaml"])   # None
    """
    try:
        proc = subprocess.run([sys.executable, str(repo / "train.py"), *train_args, "--dry-run"],
                              cwd=repo, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return f"train.py --dry-run did not finish in {timeout:.0f}s"
    if proc.returncode == 0:
        return None
    lines = [ln.strip() for ln in (proc.stderr + proc.stdout).splitlines() if ln.strip()]
    errors = [ln for ln in lines if ln.startswith("config error:")]
    return errors[-1] if errors else (lines[-1] if lines else f"exit code {proc.returncode}")


def other_runs(sweep_dir: Path, runs: Sequence[RunSpec]) -> list[str]:
    """The folders of ``<sweep dir>/runs`` that are no run of ``runs`` (e.g. of an earlier
    grid of the same sweep), sorted; neither --overwrite nor --resume touches them."""
    try:
        found = sorted(p.name for p in (sweep_dir / "runs").iterdir() if p.is_dir())
    except OSError:
        return []
    mine = {r.name for r in runs}
    return [name for name in found if name not in mine]


def validate(runs: Sequence[RunSpec], sweep_dir: Path, extra: Sequence[tuple[str, Any]],
             check: Callable[[list[str]], str | None] = dry_run_check,
             existing_is_error: bool = True, resuming: bool = False,
             launcher: str | None = None,
             resolved: tuple[dict[str, Any], list[tuple[str, str]]] | None = None
             ) -> tuple[dict[str, Any], list[tuple[str, str]]]:
    """Resolve every run (against ``launcher``; ``resolved``: ``resolve_configs``' answer
    already at hand), then check it with ``check`` (``train.py --dry-run``).

    Returns (run name -> resolved config, [(run name, problem)]; ``problem_lines`` prints
    them). A run directory that already holds a run is a problem unless the run sets
    ``run.overwrite`` (or, with ``existing_is_error=False`` as in a dry run, a printed
    warning).
    """
    configs, errors = resolved if resolved is not None else \
        resolve_configs(runs, sweep_dir, extra, launcher=launcher)
    errors = list(errors)
    warnings = []
    # Without a launcher a dry run builds on Horovod where it is installed, which refuses
    # PyTorch DDP's options; a torchrun sweep's runs are dry-run in one process instead.
    one_process = ["--set", "run.backend=local"] if launcher == "torchrun" else []
    occupied_problem = (f"the run folder in {sweep_dir / 'runs'} already holds a run; pass "
                        f"--resume to continue it, --overwrite to replace the sweep's runs, "
                        f"or --out to write elsewhere")
    for k, run in enumerate(runs, 1):
        if run.name not in configs:
            continue
        print(f"  [{k}/{len(runs)}] train.py --dry-run {run.name} ...", end="", flush=True)
        problem = check(run.train_args(sweep_dir, extra) + one_process)
        print(" ok" if problem is None else " INVALID", flush=True)
        if problem is not None:
            errors.append((run.name, problem))
            continue
        run_dir = sweep_dir / "runs" / run.name
        if occupied(run_dir) and not configs[run.name].run.overwrite and not resuming:
            (errors if existing_is_error else warnings).append((run.name, occupied_problem))
    for line in problem_lines(warnings, len(runs)):
        print(f"  warning: {line}")
    return configs, errors


# -- where the ranks run ------------------------------------------------------------------------
def local_slots(gpu: bool) -> tuple[int, str]:
    """How many ranks of a run this host takes, and what it has: one per GPU when the runs
    train on GPUs (a rank needs a GPU of its own), else one per CPU core, 2 at least (the
    demo's 2 ranks share one core; Horovod then sleeps instead of spinning while it waits)."""
    if gpu:
        import torch

        count = torch.cuda.device_count()
        return count, f"{count} GPU{'s' if count != 1 else ''} (the runs train on GPUs)"
    cores = os.cpu_count() or 1
    return max(cores, 2), f"{cores} CPU core{'s' if cores != 1 else ''}"


def check_local_ranks(np_: int, where: str, configs: dict[str, Any]) -> None:
    """Refuse, in one line, more ranks per run than this host takes (``local_slots``)
    when they all start here (no --hostfile); ``where`` says where ``np_`` came from."""
    from gravac.train.device import wants_gpu

    limit, has = local_slots(any(wants_gpu(cfg.run.device) for cfg in configs.values()))
    if np_ > limit:
        raise SweepError(f"{where} starts {np_} ranks per run on this host, which has {has}; "
                         f"pass --np {limit} (or fewer) to run here, or --hostfile FILE to "
                         f"spread them over the hosts it lists")


# -- launching ---------------------------------------------------------------------------------
#: What launches a run's ranks; train.py finds out which one did (run.backend: auto).
LAUNCHERS = ("horovodrun", "torchrun")


def find_launcher(name: str, repo: Path = REPO) -> str | None:
    """``.venv/bin/<name>`` of the repository if present, else the one on PATH."""
    local = repo / ".venv" / "bin" / name
    return str(local) if local.is_file() else shutil.which(name)


def launch_command(launcher: str, path: str, np_: int, train_args: list[str],
                   hostfile: str | None = None) -> list[str]:
    """The command that runs train.py with ``train_args`` on ``np_`` local ranks, or, with
    ``hostfile`` (horovodrun only), on the hosts it lists through
    ``hvd_scripts/run_multi_node.sh`` (which checks the configs and data here first).

    Example::

        launch_command("torchrun", "/r/.venv/bin/torchrun", 2, ["--config", "c.yaml"])
        launch_command("horovodrun", "/r/.venv/bin/horovodrun", 32,
                       ["--config", "c.yaml", "--set", "run.steps=9"], "hosts.txt")
        # ['bash', 'hvd_scripts/run_multi_node.sh', 'hosts.txt', '32', 'c.yaml', '--',
        #  '--set', 'run.steps=9']
    """
    if hostfile is not None:
        if launcher != "horovodrun":
            raise SweepError(f"--hostfile runs through horovodrun (hvd_scripts/"
                             f"run_multi_node.sh), not {launcher}; for torchrun across nodes "
                             "use hvd_scripts/run_torchrun.sh on each node")
        end = next((i for i, a in enumerate(train_args) if i and a.startswith("--")),
                   len(train_args))
        return ["bash", "hvd_scripts/run_multi_node.sh", hostfile, str(np_),
                *train_args[1:end], "--", *train_args[end:]]
    if launcher == "horovodrun":
        return [path, "-np", str(np_), "-H", f"localhost:{np_}", "--gloo", sys.executable,
                "train.py", *train_args]
    return [path, "--standalone", "--nproc-per-node", str(np_), "train.py", *train_args]


def launch(command: list[str], log_path: Path, repo: Path = REPO) -> int:
    """Run ``command`` from the repository root in a session of its own (``job.run``),
    echoing its output to the console and to ``log_path``; returns the exit status. A
    signal meanwhile stops the job, launcher and ranks, and raises ``job.Interrupted``."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "wb") as log:
        log.write(("$ " + " ".join(command) + "\n").encode())

        def echo(chunk: bytes, from_stderr: bool) -> None:
            sys.stdout.flush()
            sys.stdout.buffer.write(chunk)
            sys.stdout.buffer.flush()
            log.write(chunk)

        return job.run(command, cwd=repo, on_output=echo, merge=True)


def failure_note(log_path: Path, code: int) -> str:
    """A short reason for a failed run: the last gravac error line of its log (a rank's
    one line, not the launcher's traceback after it), else its last error-looking line."""
    try:
        lines = [ln.strip() for ln in log_path.read_text(errors="replace").splitlines()
                 if ln.strip()]
    except OSError:
        lines = []
    errors = [ln for ln in lines[1:] if "error" in ln.lower()]
    text = job.error_line(lines[1:]) or (errors[-1] if errors else f"exit code {code}")
    return (text[:197] + "...") if len(text) > 200 else text


def run_report(run_dirs: Sequence[Path], out_dir: Path, baseline: Path | None,
               repo: Path = REPO) -> bool:
    """``python -m gravac.report RUN_DIR... --out OUT [--baseline DIR]``; False if it failed."""
    command = [sys.executable, "-m", "gravac.report", *map(str, run_dirs), "--out", str(out_dir)]
    if baseline is not None:
        command += ["--baseline", str(baseline)]
    print("$ " + " ".join(command), flush=True)
    code = subprocess.run(command, cwd=repo).returncode
    if code != 0:
        print(f"the report failed (exit code {code}); the results table is still in "
              f"{out_dir.parent}")
    return code == 0


def write_reports(names: Sequence[str], status: dict[str, str],
                  baselines: dict[str, str | None], sweep_dir: Path) -> bool:
    """The report of the finished runs, against the baselines of the results table: one
    report in ``<sweep dir>/report`` when they share one baseline, else one per baseline in
    ``<sweep dir>/report/<baseline run>`` (``report/no_baseline`` for the runs whose
    baseline did not finish or that have none). Each one's baseline is said on the console.
    False if one failed."""
    groups = report_groups(names, status, baselines)
    ok = True
    for base, members in groups:
        out = sweep_dir / "report"
        if len(groups) > 1:
            out = out / (base or "no_baseline")
        against = f"speedups against {base}" if base else \
            "no baseline run of the results table finished (gravac.report's default: the " \
            "first dense run among them, if any)"
        print(f"\nreport of {len(members)} run(s) in {out}: {against}", flush=True)
        ok = run_report([sweep_dir / "runs" / name for name in members], out,
                        sweep_dir / "runs" / base if base else None) and ok
    return ok


# -- command line ------------------------------------------------------------------------------
def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    def positive(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = 0
        if value < 1:
            raise argparse.ArgumentTypeError(f"must be a positive integer, got {text!r}")
        return value

    parser = argparse.ArgumentParser(
        prog="python -m gravac.sweep",
        description="Run a grid of gravac trainings and tabulate the results.",
        epilog="Example: .venv/bin/python -m gravac.sweep configs/sweeps/demo_sweep.yaml\n"
               "The sweep file format is described in gravac/sweep/__init__.py.",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("sweep_file", metavar="SWEEP_FILE", help="the sweep's YAML file")
    parser.add_argument("--np", type=positive, default=None,
                        help="ranks per run (default: the file's np, else 2); without "
                             "--hostfile at most this host's GPUs, or CPU cores")
    parser.add_argument("--dry-run", action="store_true",
                        help="only validate every run and print the expanded runs")
    parser.add_argument("--out", metavar="DIR", default=None,
                        help="sweep directory (default: <repo>/runs/sweeps/<name>)")
    parser.add_argument("--set", dest="overrides", action="append", default=[],
                        metavar="KEY=VALUE",
                        help="extra override for every run, e.g. --set data.root=/data "
                             "(a relative data.root is taken from the current directory); "
                             "repeatable; applied after the file's overrides")
    parser.add_argument("--launcher", choices=LAUNCHERS, default="horovodrun",
                        help="what starts each run's ranks (default: horovodrun); with "
                             "torchrun the runs use torch.distributed, and a dense baseline "
                             "is PyTorch DDP")
    parser.add_argument("--config", dest="configs", action="append", default=[],
                        metavar="FILE",
                        help="a config file added after every run's own (later files win), "
                             "e.g. configs/paper/scaled_images.yaml; repeatable")
    parser.add_argument("--hostfile", metavar="FILE", default=None,
                        help="run every run across the hosts of FILE (HOST slots=N lines) "
                             "with hvd_scripts/run_multi_node.sh (horovodrun only)")
    parser.add_argument("--link", metavar="RATE", default=None,
                        help="the link every run crosses: a rate such as 100mbit or 1gbit "
                             "(hvd_scripts/bandwidth_sandbox.sh, root only) or none for the "
                             "plain loopback; default: the file's link")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace the runs of this grid left in the sweep directory "
                             "by an earlier sweep (run folders the grid lacks are kept)")
    parser.add_argument("--resume", action="store_true",
                        help="continue an interrupted sweep: keep the runs that finished, "
                             "resume the interrupted one from its checkpoint, run the rest")
    return parser.parse_args(argv)


def resume_plan(run_dir: Path, cfg) -> tuple[str, list[str]]:
    """What ``--resume`` does with a run: ("skip" | "resume" | "restart" | "new", the extra
    train.py arguments). A run is kept when it finished the steps its config asks for (its
    run_end record is the completed marker); a run with a checkpoint continues from it;
    a run that logged but never checkpointed starts again."""
    from gravac.train.checkpoint import has_checkpoint

    if finished(run_dir):
        end = load_run(run_dir).end or {}
        if cfg.run.steps is None or end.get("step") == cfg.run.steps:
            return "skip", []
    if has_checkpoint(run_dir):
        return "resume", ["--resume"]
    if occupied(run_dir):
        return "restart", ["--set", "run.overwrite=true"]
    return "new", []


#: Keys whose relative path on the sweep's command line is taken from the current directory
#: (where it was typed); train.py runs from the repository root and would read it there.
CWD_PATH_KEYS = ("data.root",)


def cli_overrides(texts: Sequence[str], overwrite: bool,
                  cwd: Path | None = None) -> list[tuple[str, Any]]:
    """``--set KEY=VALUE`` texts as (key, YAML value) pairs (plus run.overwrite=true). A
    relative ``data.root`` is made absolute against ``cwd`` (default: the current
    directory), where the user typed it.

    Example::

        cli_overrides(["data.root=/data"], False)   # [('data.root', '/data')]
        cli_overrides(["data.root=fake"], False, Path("/home/me"))
        # [('data.root', '/home/me/fake')]
    """
    out = []
    for text in texts:
        key, sep, raw = text.partition("=")
        if not sep:
            raise SweepError(f"--set {text!r}: expected KEY=VALUE, e.g. data.root=/data")
        try:
            value = yaml.safe_load(raw) if raw.strip() else None
        except yaml.YAMLError:
            value = raw
        key = check_key(f"--set {text!r}", key.strip())
        if key in CWD_PATH_KEYS and isinstance(value, str) and value.strip():
            value = os.path.abspath(os.path.join(cwd or Path.cwd(), os.path.expanduser(value)))
        out.append((key, value))
    if overwrite:
        out.append(("run.overwrite", True))
    return out


def describe(sweep: Sweep, runs: Sequence[RunSpec], sweep_dir: Path,
             extra: Sequence[tuple[str, Any]], baselines: dict[str, str | None]) -> str:
    """The expanded runs, one block each, as printed before validating."""
    lines = [f"sweep {sweep.name}: {len(runs)} runs on {sweep.np} ranks each, results in "
             f"{sweep_dir}"]
    width = max(len(r.name) for r in runs)
    for k, run in enumerate(runs, 1):
        axes = "  ".join(f"{a}={v}" for a, v in run.cells.items())
        base = baselines.get(run.name)
        mark = "  (baseline)" if base == run.name else (f"  baseline: {base}" if base else "")
        lines.append(f"  {k:>2}. {run.name:<{width}}  {axes}{mark}")
        lines.append("      train.py " + " ".join(run.train_args(sweep_dir, extra)))
    return "\n".join(lines)


def execute(sweep: Sweep, runs: Sequence[RunSpec], sweep_dir: Path,
            extra: Sequence[tuple[str, Any]], baselines: dict[str, str | None],
            launcher: str, launcher_path: str, resume_configs: dict | None = None,
            hostfile: str | None = None, link: LinkPlan = LinkPlan((), "")) -> int:
    """Launch the runs one after another, keeping the results files current; exit status.
    With ``resume_configs`` (run name -> resolved config: ``--resume``), finished runs are
    kept and an interrupted one continues from its checkpoint. ``link``: each job runs
    behind its prefix (a rate-limited loopback)."""
    status = {r.name: "pending" for r in runs}
    notes: dict[str, str] = {}
    plans = {r.name: resume_plan(sweep_dir / "runs" / r.name, resume_configs[r.name])
             for r in runs} if resume_configs is not None else {}
    for name, (what, _) in plans.items():
        if what == "skip":
            status[name], notes[name] = "ok", "finished in an earlier sweep (--resume)"

    def save() -> list[dict]:
        rows = results_rows(sweep, runs, sweep_dir, status, notes, baselines)
        write_results(sweep, rows, sweep_dir)
        return rows

    if sweep.source is not None:
        atomic_write_text(sweep_dir / "sweep.yaml", sweep.source.read_text())
    rows = save()
    # A signal between runs, as during one, ends the sweep (a running job is stopped first).
    try:
        with job.signals_raise():
            for k, run in enumerate(runs, 1):
                what, more = plans.get(run.name, ("new", []))
                if what == "skip":
                    print(f"\n=== [{k}/{len(runs)}] {run.name}: finished earlier, kept ===",
                          flush=True)
                    continue
                if what in ("resume", "restart"):
                    notes[run.name] = ("resumed from its checkpoint (--resume)"
                                       if what == "resume" else
                                       "started again: it had no checkpoint (--resume)")
                command = [*link.prefix, *launch_command(
                    launcher, launcher_path, sweep.np, run.train_args(sweep_dir, extra) + more,
                    hostfile)]
                print(f"\n=== [{k}/{len(runs)}] {run.name} ===\n$ {' '.join(command)}",
                      flush=True)
                log_path = sweep_dir / "logs" / f"{run.name}.log"
                status[run.name] = "running"
                save()
                code = launch(command, log_path)
                if code == 0 and finished(sweep_dir / "runs" / run.name):
                    status[run.name] = "ok"
                else:
                    status[run.name] = "failed"
                    notes[run.name] = failure_note(log_path, code) if code else \
                        f"no run_end record in {METRICS_FILE}"
                    print(f"=== {run.name} FAILED: {notes[run.name]} (log: {log_path}) ===",
                          flush=True)
                rows = save()
            ok = [r for r in runs if status[r.name] == "ok"]
            print(f"\nsweep {sweep.name}: {len(ok)} of {len(runs)} runs ok; results: "
                  f"{sweep_dir / 'results.md'}, {sweep_dir / 'results.csv'}")
            verdict = fastest_line(rows, sweep)
            if verdict:
                print(verdict)
            report_ok = write_reports([r.name for r in runs], status, baselines, sweep_dir)
            return 0 if len(ok) == len(runs) and report_ok else 1
    except job.Interrupted as stopped:
        for name, state in status.items():
            if state == "running":
                status[name], notes[name] = "interrupted", str(stopped)
        save()
        print(f"\n{stopped}: the sweep ends here; partial results in "
              f"{sweep_dir / 'results.md'} (continue with --resume)", flush=True)
        return stopped.exit_code


def main(argv: Sequence[str] | None = None,
         check: Callable[[list[str]], str | None] = dry_run_check) -> int:
    """Command-line entry point; returns the exit status (see the module docstring)."""
    args = parse_args(argv)
    if args.resume and args.overwrite:
        print("sweep error: --resume keeps the finished runs and --overwrite replaces them; "
              "pass one of them", file=sys.stderr)
        return 2
    try:
        sweep = load_sweep(args.sweep_file)
        extra = cli_overrides(args.overrides, args.overwrite)
        if args.np is not None:
            sweep.np = args.np
        if args.hostfile is not None:
            launch_command(args.launcher, "", sweep.np, [], args.hostfile)   # refuses torchrun
            if not Path(args.hostfile).is_file():
                raise SweepError(f"--hostfile {args.hostfile}: no such file (one host per "
                                 "line: HOST slots=N)")
        if args.link is not None:
            sweep.link = check_rate("--link", args.link)
        if sweep.link is not None and args.hostfile is not None:
            raise SweepError(f"link {sweep.link} limits this host's loopback, but --hostfile "
                             "runs cross the hosts' own network; drop one of them")
        runs = expand(sweep)
        for run in runs:
            run.files = [*run.files, *args.configs]
    except SweepError as exc:
        print(f"sweep error: {exc}", file=sys.stderr)
        return 2
    link = link_plan(sweep.link) if args.hostfile is None else \
        LinkPlan((), "the network between the hosts of --hostfile")
    sweep.link_description = link.description
    sweep_dir = Path(args.out).expanduser().resolve() if args.out else \
        REPO / "runs" / "sweeps" / sweep.name
    launcher_path = find_launcher(args.launcher) or ""
    if not args.dry_run and not launcher_path:
        print(f"sweep error: {args.launcher} not found (neither .venv/bin/{args.launcher} nor on "
              "PATH); run hvd_scripts/install.sh", file=sys.stderr)
        return 2

    resolved = resolve_configs(runs, sweep_dir, extra, launcher=args.launcher)
    if args.hostfile is None:
        try:
            check_local_ranks(sweep.np, f"--np {sweep.np}" if args.np is not None else
                              f"np: {sweep.np} (the sweep file's)", resolved[0])
        except SweepError as exc:
            print(f"sweep error: {exc}", file=sys.stderr)
            return 2
    print(f"validating {len(runs)} runs of sweep {sweep.name} (resolve + train.py --dry-run)")
    configs, errors = validate(runs, sweep_dir, extra, check,
                               existing_is_error=not args.dry_run, resuming=args.resume,
                               launcher=args.launcher, resolved=resolved)
    controllers = {name: cfg.compression.controller for name, cfg in configs.items()}
    baselines = pick_baselines(sweep, runs, controllers)
    print(describe(sweep, runs, sweep_dir, extra, baselines))
    print(f"link: {link.description}")
    if errors:
        for line in problem_lines(errors, len(runs)):
            print(f"sweep error: {line}", file=sys.stderr)
        bad = len({name for name, _ in errors})
        print(f"sweep error: {bad} of {len(runs)} runs invalid; nothing was launched",
              file=sys.stderr)
        return 2
    others = other_runs(sweep_dir, runs)
    if others:
        shown = ", ".join(others[:5]) + (f" and {len(others) - 5} more" if len(others) > 5
                                          else "")
        print(f"note: {sweep_dir / 'runs'} also holds {len(others)} run(s) this sweep does not "
              f"have ({shown}); they are left as they are, out of the results and the report")
    if args.dry_run:
        print(f"all {len(runs)} runs are valid (dry run: nothing launched)")
        return 0
    return execute(sweep, runs, sweep_dir, extra, baselines, args.launcher, launcher_path,
                   resume_configs=configs if args.resume else None,
                   hostfile=None if args.hostfile is None else
                   str(Path(args.hostfile).expanduser().resolve()), link=link)


if __name__ == "__main__":
    sys.exit(main())
