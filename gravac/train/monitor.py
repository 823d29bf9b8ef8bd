"""Run monitoring on rank 0: a JSON-lines metrics file, TensorBoard events and a tqdm bar.

Other ranks get a logger whose methods do nothing, so the loop calls it unconditionally.
A metrics file that cannot be written (a full disk) raises ``MetricsError``: one line naming
the file and the checkpoint that ``--resume`` continues from.

Example::

    log = RunLogger(run_dir, enabled=(rank == 0), total_steps=1000, progress="auto")
    log.record({"kind": "step", "step": 3, "loss": 2.1, ...})   # JSONL + TensorBoard
    log.progress(step=3, loss=2.1, cf=20.0, samples_per_sec=800.0)
    log.close()
"""
from __future__ import annotations

import json
import math
import os
import re
import sys
import threading
import time
from pathlib import Path

from ..engine.run_record import (EVAL, KINDS, METHOD, METRICS_FILE, NUMBER, RANKS_DIR,
                                 RUN_END, STEP, TENSORBOARD_TAGS, WINDOW)
from ..util.atomic import write_problem
from .checkpoint import latest_info

#: The numbers of a window record that TensorBoard shows as ``gravac/<field>``.
_WINDOW_SCALARS = tuple(name for name, type_ in KINDS[WINDOW].fields.items()
                        if type_ == NUMBER and name != "time")


def _finite(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _tag_name(method) -> str:
    """A method's name as TensorBoard keeps it in a tag (it replaces ':' and '@' itself)."""
    return re.sub(r"[^\w.-]", "_", str(method))


PLAIN_EVERY_S = 60.0       # at most this long between two plain progress lines


class MetricsError(RuntimeError):
    """A metrics file could not be written: the run stops; its checkpoints stay."""


def _metrics_error(exc: OSError, path: Path, run_dir: Path, step) -> MetricsError:
    """The run cannot go on without its record; what it has saved so far is kept."""
    latest = latest_info(run_dir)
    kept = (f"its checkpoint of step {latest['step']} is kept: free space, then continue "
            "with --resume" if latest else "no checkpoint was written yet: free space and "
            "start it again")
    return MetricsError(f"{write_problem(exc, path)}: the run stops at step {step} ({kept})")


class _Discard:
    """A file that drops what is written to it (no fileno: nothing to fsync)."""

    def write(self, data) -> int:
        return len(data)

    def flush(self) -> None:
        pass

    def close(self) -> None:
        pass


def _close_tensorboard(writer, logdir: Path) -> None:
    """Close TensorBoard's writer; events it cannot write (a full disk) are given up with
    one line. Its events mirror metrics.jsonl, so the run does not fail for them."""
    try:
        writer.close()
        return
    except (OSError, ValueError) as exc:
        print(f"TensorBoard events in {logdir} may lack their last steps ({exc})", flush=True)
    # tensorboardX left its files, its writer threads and its exit hook to retry the write,
    # each of which would print a traceback after gravac's line. Its event files (an
    # internal of tensorboardX 2.x) are swapped for a sink while its threads may still
    # write; closing the writer then joins the threads, and only then are the files closed
    # (a file closed under a running thread made it print "write to closed file"). What
    # the threads raise meanwhile is the failure the line above reported.
    try:
        recorders = [fw.event_writer._ev_writer._py_recordio_writer
                     for fw in writer.all_writers.values()]
        workers = {fw.event_writer._worker for fw in writer.all_writers.values()}
    except AttributeError:
        return                             # another tensorboardX: its own messages remain
    previous = threading.excepthook

    def quiet(args) -> None:
        if args.thread not in workers or not issubclass(args.exc_type, (OSError, ValueError)):
            previous(args)

    threading.excepthook = quiet
    files = []
    try:
        for records in recorders:
            files.append(records._writer)
            records._writer = _Discard()
        writer.close()
    except (AttributeError, OSError, ValueError):
        pass
    finally:
        threading.excepthook = previous
    for file in files:
        try:
            file.close()
        except (OSError, ValueError):
            pass                           # the same failure: the file is closed anyway


def plain_progress(step: int, total: int, elapsed: float, steps_done: int, loss=None, cf=None,
                   samples_per_sec=None) -> str:
    """One progress line for logs: ``step 120/1000 (12%)  loss 2.31  cf 20  1234 samples/s
    eta 3m10s`` (what is unknown is left out).

    >>> plain_progress(120, 1000, 30.0, 100, loss=2.3123, cf=20.0, samples_per_sec=1234.5)
    'step 120/1000 (12%)  loss 2.312  cf 20  1234 samples/s  eta 4m24s'
    """
    parts = [f"step {step}/{total} ({100 * step // max(total, 1)}%)"]
    if _finite(loss):
        parts.append(f"loss {loss:.4g}")
    if _finite(cf):
        parts.append(f"cf {cf:g}")
    if _finite(samples_per_sec):
        parts.append(f"{samples_per_sec:.0f} samples/s")
    if steps_done > 0 and step < total:
        left = elapsed / steps_done * (total - step)
        minutes, seconds = divmod(int(round(left)), 60)
        parts.append(f"eta {minutes}m{seconds:02d}s" if minutes else f"eta {seconds}s")
    return "  ".join(parts)


class RunLogger:
    """Writes ``metrics.jsonl`` and TensorBoard events under ``run_dir`` (rank 0 only);
    the records are the run-record schema's (gravac/engine/run_record.py)."""

    def __init__(self, run_dir, enabled: bool, total_steps: int, progress: str = "auto",
                 initial_step: int = 0):
        self.enabled = enabled
        self._bar, self._plain = None, False
        self._writer = None
        self._file = None
        if not enabled:
            return
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self._file = open(self.run_dir / METRICS_FILE, "a", encoding="utf-8")
        from tensorboardX import SummaryWriter

        # A resumed run logs the steps after its checkpoint again: purge_step drops the
        # events an interrupted session wrote after it, so that no step appears twice.
        # Event files are named by the second they were opened in; a session reopened
        # within the same second (a quick resume, an elastic reset) would overwrite the
        # previous file, so the name also carries the step (sorted, as readers read files
        # in name order) and the process.
        self._writer = SummaryWriter(logdir=str(self.run_dir / "tensorboard"),
                                     purge_step=initial_step + 1 if initial_step else None,
                                     filename_suffix=f".step{initial_step:09d}.{os.getpid()}")
        # auto: a bar on a terminal; under horovodrun (whose output is never a terminal)
        # or into a file, a plain line every tenth of the run or minute, so logs stay
        # readable
        bar = progress == "always" or (progress == "auto" and sys.stderr.isatty())
        self._plain = not bar and progress in ("auto", "plain")
        if bar:
            from tqdm import tqdm

            self._bar = tqdm(total=total_steps, initial=initial_step, unit="step",
                             dynamic_ncols=True)
        self._total, self._first_step = total_steps, initial_step
        self._t0 = self._last_line = time.monotonic()
        self._last_tenth = -1

    def record(self, entry: dict) -> None:
        """Append one record to the metrics file and mirror its numbers to TensorBoard."""
        if not self.enabled or self._file is None:
            return
        step = entry.get("step", 0)
        try:
            self._file.write(json.dumps(entry, default=float) + "\n")
            self._file.flush()
        except OSError as exc:
            self.close()
            raise _metrics_error(exc, self.run_dir / METRICS_FILE, self.run_dir, step) from exc
        kind = entry.get("kind")
        if kind == STEP:
            for tag, key in TENSORBOARD_TAGS.items():
                if _finite(entry.get(key)):
                    self._writer.add_scalar(tag, entry[key], step)
        elif kind == EVAL:
            for key, value in entry.items():
                if key not in ("kind", "step", "time") and _finite(value):
                    self._writer.add_scalar(f"eval/{key}", value, step)
        elif kind == WINDOW:
            for key in _WINDOW_SCALARS:
                if _finite(entry.get(key)):
                    self._writer.add_scalar(f"gravac/{key}", entry[key], step)
            for cf, value in (entry.get("table") or {}).items():
                if _finite(value):
                    self._writer.add_scalar(f"gravac/compression_throughput/cf_{float(cf):g}",
                                            value, step)
            self._writer.add_scalar("gravac/settled", float(bool(entry.get("settled"))), step)
            if "on_dense" in entry:      # settle_dense (E3): training dense
                self._writer.add_scalar("gravac/on_dense", float(bool(entry["on_dense"])), step)
        elif kind == METHOD:
            self._method_event(entry, step)

    def _method_event(self, entry: dict, step: int) -> None:
        """Auto's event (``run_record.METHOD``): its line under the text tag ``auto/events``;
        a measured entry's step time and gain under ``auto/step_time/<method>`` and
        ``auto/gain/<method>``; a choice's scores under ``auto/score/<method>`` and the
        chosen method's name as text under ``auto/chosen``, with ``<method>`` spelled as
        TensorBoard keeps tags (``powersgd_4``, ``sparse_40_shared_index``). (The step's
        own ``cf`` cannot tell methods apart: dense and fp16 both send at CF 1.)"""
        method, event = entry.get("method"), entry.get("event")
        details = ", ".join(f"{k}={v:.4g}" if _finite(v) else f"{k}={v}"
                            for k, v in entry.items()
                            if k not in ("kind", "step", "time", "event", "method", "scores"))
        self._writer.add_text("auto/events", f"step {step}: {event} {method}"
                              + (f" ({details})" if details else ""), step)
        if event == "measured":
            for key, tag in (("t", "step_time"), ("gain", "gain")):
                if _finite(entry.get(key)):
                    self._writer.add_scalar(f"auto/{tag}/{_tag_name(method)}", entry[key],
                                            step)
        elif event == "chosen":
            self._writer.add_text("auto/chosen", str(method), step)
            for name, score in (entry.get("scores") or {}).items():
                if _finite(score):
                    self._writer.add_scalar(f"auto/score/{_tag_name(name)}", score, step)

    def progress(self, step: int, **fields) -> None:
        if self._plain:
            self._plain_line(step, fields)
        if self._bar is None:
            return
        self._bar.n = step
        self._bar.set_postfix({k: (f"{v:.4g}" if _finite(v) else v) for k, v in fields.items()},
                              refresh=False)
        self._bar.refresh()

    def _plain_line(self, step: int, fields: dict) -> None:
        now = time.monotonic()
        tenth = 10 * step // max(self._total, 1)
        if not (tenth > self._last_tenth or now - self._last_line >= PLAIN_EVERY_S
                or step == self._total):
            return
        self._last_tenth, self._last_line = tenth, now
        print(plain_progress(step, self._total, now - self._t0, step - self._first_step,
                             **fields), flush=True)

    def message(self, text: str) -> None:
        """A line for the user (through tqdm when the bar is shown)."""
        if not self.enabled:
            return
        if self._bar is not None:
            self._bar.write(text)
        else:
            print(text, flush=True)

    def close(self) -> None:
        bar, writer, file = self._bar, self._writer, self._file
        self._bar = self._writer = self._file = None
        if bar is not None:
            bar.close()
        if writer is not None:
            _close_tensorboard(writer, self.run_dir / "tensorboard")
        if file is not None:
            try:
                file.close()
            except OSError:
                pass   # only after a failed write (each record is flushed): said already


class RankPhaseLog:
    """Every rank's own step record, ``ranks/rank{r}.jsonl`` (``run.rank_phases``).

    metrics.jsonl holds rank 0's timings alone, and a collective ends when its slowest
    rank arrives: where one rank's compute or compression runs longer, the *other* rank's
    waits grow, and rank 0's record cannot say which. Each rank writes its own file (no
    collective); lines are buffered and flushed every ``flush_every`` records and on
    ``close``. A resumed run appends: the reader keeps the last record of each step
    (``gravac.report.load_rank_steps``).

    Example::

        log = RankPhaseLog(run_dir, rank=1, enabled=True)
        log.record({"step": 5, "t_iter": 0.21, "t_select": 0.02, ...})
        log.close()
    """

    def __init__(self, run_dir, rank: int, enabled: bool, flush_every: int = 50):
        self._file = None
        self._rank, self._flush_every, self._pending = rank, flush_every, 0
        self._step = None
        if not enabled:
            return
        self._run_dir = Path(run_dir)
        self._path = self._run_dir / RANKS_DIR / f"rank{rank}.jsonl"
        self._path.parent.mkdir(parents=True, exist_ok=True)
        self._file = open(self._path, "a", encoding="utf-8")

    def record(self, entry: dict) -> None:
        if self._file is None:
            return
        self._step = entry.get("step")
        try:
            self._file.write(json.dumps({"rank": self._rank, **entry}, default=float) + "\n")
            self._pending += 1
            if self._pending >= self._flush_every:
                self._file.flush()
                self._pending = 0
        except OSError as exc:
            self._fail(exc)

    def close(self) -> None:
        if self._file is not None:
            try:
                self._file.close()
            except OSError as exc:
                self._fail(exc)
        self._file = None

    def _fail(self, exc: OSError) -> None:
        file, self._file = self._file, None
        try:
            file.close()
        except OSError:
            pass                 # the same failure again, on the lines still buffered
        raise _metrics_error(exc, self._path, self._run_dir, self._step) from exc


def truncate_metrics(run_dir, step: int) -> None:
    """Drop records after ``step`` (a resumed run re-logs them), atomically."""
    from ..util.atomic import atomic_write_text

    path = Path(run_dir) / METRICS_FILE
    if not path.is_file():
        return
    kept = []
    for line in path.read_text().splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue          # a line cut by a crash
        if entry.get("kind") == RUN_END or entry.get("step", 0) > step:
            continue
        kept.append(line)
    atomic_write_text(path, "".join(f"{line}\n" for line in kept))
