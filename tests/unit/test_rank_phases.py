"""run.rank_phases: every rank's own step timings (ranks/rank{r}.jsonl), and the skew
benchmarks/step_profile.py --all-ranks computes from them."""
import json
import sys
from pathlib import Path

import pytest

from gravac.engine.phases import PHASES
from gravac.engine.run_record import RANK_STEP_FIELDS
from gravac.report import load_rank_steps
from gravac.train.config import load_config
from gravac.train.loop import train
from gravac.train.monitor import RankPhaseLog

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))
from step_profile import busy_ms, skew  # noqa: E402


def test_rank_log_round_trip_keeps_the_last_record_of_a_step(tmp_path):
    log = RankPhaseLog(tmp_path, rank=1, enabled=True, flush_every=2)
    for step in (1, 2, 3):
        log.record({"step": step, "t_iter": 0.1 * step})
    log.close()
    # a resume re-runs step 3, and a crash cut the last line
    log = RankPhaseLog(tmp_path, rank=1, enabled=True)
    log.record({"step": 3, "t_iter": 0.5})
    log.close()
    with open(tmp_path / "ranks" / "rank1.jsonl", "a") as f:
        f.write('{"step": 4, "t_it')
    got = load_rank_steps(tmp_path)
    assert list(got) == [1]
    assert [(r["rank"], r["step"], r["t_iter"]) for r in got[1]] == \
        [(1, 1, 0.1), (1, 2, 0.2), (1, 3, 0.5)]


def test_disabled_rank_log_writes_nothing(tmp_path):
    log = RankPhaseLog(tmp_path, rank=0, enabled=False)
    log.record({"step": 1})
    log.close()
    assert not (tmp_path / "ranks").exists() and load_rank_steps(tmp_path) == {}


def _record(step, compute, compress, update, **more):
    return {"step": step, "t_iter": 1.0, "t_compute": compute, "t_compress": compress,
            "t_update": update, "sent": "min", **more}


def test_skew_is_the_busiest_minus_the_least_busy_rank_per_step():
    by_rank = {
        0: [_record(s, 0.100, 0.020, 0.005) for s in range(1, 6)],
        # rank 1: 30 ms more work on steps 2-5, 10 ms less on step 1 (before the warm-up cut)
        1: [_record(1, 0.090, 0.020, 0.005)] +
           [_record(s, 0.120, 0.030, 0.005) for s in range(2, 6)],
    }
    assert busy_ms(by_rank[0][0]) == pytest.approx(125.0)
    out = skew(by_rank, warmup=2)
    assert out["steps"] == 4
    assert out["median_ms"] == pytest.approx(30.0) and out["p90_ms"] == pytest.approx(30.0)
    assert out["busiest"] == {1: 4}
    # skipped steps and steps only one rank recorded do not count
    by_rank[0].append(_record(6, 0.1, 0.0, 0.0, sent="skipped"))
    by_rank[1].append(_record(6, 0.5, 0.0, 0.0))
    by_rank[1].append(_record(7, 0.5, 0.0, 0.0))
    assert skew(by_rank, warmup=2)["steps"] == 4
    assert skew({0: by_rank[0]}, warmup=2) == {}


def test_training_with_rank_phases_writes_each_logged_step(tmp_path):
    cfg = load_config([str(REPO / "configs/demo.yaml"),
                       str(REPO / "configs/compression/gravac_exp_topk.yaml")],
                      [f"run.output_dir={tmp_path}", "run.name=ranks", "run.steps=12",
                       "run.backend=local", "run.log_interval=5", "run.progress=never",
                       "run.report=false", "run.rank_phases=true",
                       "compression.gravac.window=5"])
    train(cfg)
    run_dir = tmp_path / "ranks"
    metrics = {r["step"]: r for r in map(json.loads, (run_dir / "metrics.jsonl").read_text()
                                         .splitlines()) if r["kind"] == "step"}
    got = load_rank_steps(run_dir)
    assert list(got) == [0]
    assert [r["step"] for r in got[0]] == [1, 5, 10, 12] == sorted(metrics)
    for r in got[0]:
        assert set(r) == {"rank", *RANK_STEP_FIELDS}
        assert {k: r[k] for k in RANK_STEP_FIELDS} == \
            {k: metrics[r["step"]][k] for k in RANK_STEP_FIELDS}
    assert set(PHASES) <= set(RANK_STEP_FIELDS)
