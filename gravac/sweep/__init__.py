"""Run a grid of gravac trainings one after another and tabulate the results.

Usage::

    .venv/bin/python -m gravac.sweep SWEEP_FILE [--np N] [--dry-run] [--out DIR]
                                 [--set KEY=VALUE ...] [--overwrite | --resume]
                                 [--launcher horovodrun|torchrun]
                                 [--config FILE ...] [--hostfile FILE] [--link RATE]
    (hvd_scripts/sweep.py is the same command)

Examples::

    .venv/bin/python -m gravac.sweep configs/sweeps/demo_sweep.yaml
    .venv/bin/python -m gravac.sweep configs/paper/table2_resnet101.yaml --np 4 \\
        --set data.root=/data/cifar --dry-run

A sweep file is YAML::

    name: demo_sweep            # results go to runs/sweeps/<name>/ unless --out
    np: 2                       # ranks per run (--np overrides)
    configs: [configs/demo.yaml]             # base config files for every run
    set: {run.steps: 60}                     # overrides for every run (optional)
    grid:                                    # cartesian product of the axes
      compression:                           # an axis: a list of entries, each with
        - {files: [configs/compression/dense.yaml]}       # files, set and/or tag
        - {files: [configs/compression/static_topk_10x.yaml]}
        - {set: {compression.controller: gravac, compression.gravac.window: 20}, tag: gravac_w20}
      optimizer.lr: [0.05, 0.1]              # a dotted axis name: one key's values
    baseline: {compression: 0}               # optional, axis -> index (or label)
    link: 100mbit                            # optional: the link the runs cross

``link`` (or ``--link RATE``; ``none`` for the plain loopback): every run crosses a
loopback limited to RATE (``hvd_scripts/bandwidth_sandbox.sh``, root only; elsewhere the
plain loopback, said where the sweep starts). Compression buys time only where the
exchange is slow, and nothing limits a loopback (``link.py``). The results name the link
and the fastest run against its baseline.

What a run gets: ``--config`` the base files, then each axis entry's ``files`` (axis
order), then the command line's ``--config`` files (e.g. the scaled-down set of
``configs/paper/``); ``--set`` the sweep's ``set``, then each axis entry's ``set`` (axis order, later
wins), then the command line's ``--set``, then ``run.output_dir=<sweep dir>/runs`` and
``run.name=<sweep name>-<axis labels joined by '-'>``. Relative config paths, and relative
paths inside the sweep and config files, are relative to the repository root (where
train.py runs); a relative ``--set data.root=DIR`` on the command line is relative to the
current directory (where it was typed) and reaches the runs as an absolute path.

The baseline of a run is the grid point with the ``baseline`` indices on the axes it
names and the run's own indices on the others; without ``baseline`` it is the first run
whose ``compression.controller`` is ``dense`` (if any).

Before anything is launched every run is resolved and checked with ``train.py --dry-run``
(plain python, no horovodrun); one bad run stops the sweep there, naming the run and the
config error (a problem shared by several runs, such as a data.root without the data, is
one line naming them). Runs then go one after another under ``horovodrun --gloo`` (or, with
``--launcher torchrun``, ``torchrun --standalone``) on this host, or with ``--hostfile``
across the hosts it lists (``hvd_scripts/run_multi_node.sh``). Without ``--hostfile``
every rank starts on this host, so a sweep (dry run included) whose np is more than this
host takes is refused before anything else, in one line naming ``--np`` and
``--hostfile``: one rank per GPU when the runs train on GPUs, else one per CPU core (2 at
least); the paper's files ask for 32. A
failing run is recorded as failed (its note: the rank's gravac error line, not the
launcher's traceback after it) and the sweep goes on. ``results.csv`` and
``results.md`` in the sweep directory are rewritten (atomically) after every run; an axis
over one key shows its values there (``run.seed`` 0, 1), any other axis its labels; a grid
with an axis over ``run.seed`` also gets each point of the other axes over its seeds
(mean and sample standard deviation of the finished runs' numbers: a table at the end of
``results.md`` and ``results_seeds.csv``). At the
end ``python -m gravac.report`` plots the successful runs into ``<sweep dir>/report``, with
the speedups of the results table: it takes one baseline, so when the runs have several
(e.g. each seed's own dense run) there is one report per baseline, in
``<sweep dir>/report/<baseline run>`` (``report/no_baseline`` for runs whose baseline did
not finish), and the sweep says which baseline each report uses.
Each run's console output is kept in ``<sweep dir>/logs/<run name>.log``.

A signal to the sweep (Ctrl-C, SIGTERM, SIGHUP) stops the job it runs: each job runs in
a session of its own, the signal goes to it (the ranks checkpoint), and whatever of it,
launcher or rank, is left after 45 s is killed (``gravac/util/job.py``); that run is
recorded as interrupted and the sweep ends.

An interrupted sweep (a signal, a lost machine) continues with ``--resume``: a run whose
metrics end with the trainer's run_end record at the steps its config asks for is kept
(that record is the completed marker), a run with a checkpoint continues from it
(``train.py --resume``), a run that logged but never checkpointed starts again, the rest
run as usual; the results table and report cover all of them. ``--overwrite`` instead
replaces the runs of this sweep's grid. Neither touches a run folder of the sweep
directory that the grid does not have (one of an earlier, larger grid): it stays in
``runs/`` and ``logs/``, out of the results and the report, and the sweep names it where it
starts; remove it yourself, or use ``--out``, for a directory with this grid only.

Exit status: 0 all runs succeeded (or the dry run found every run valid), 1 a run or the
report failed, 2 the sweep file or a run's config is invalid, 128 + N stopped by signal N
(130 Ctrl-C, 143 SIGTERM).
"""

from .runner import main
from .errors import SweepError
from .spec import Sweep, expand, load_sweep, parse_sweep

__all__ = ["Sweep", "SweepError", "expand", "load_sweep", "main", "parse_sweep"]
