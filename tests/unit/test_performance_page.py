"""benchmarks/performance.py on a result set measured under both launchers: each
launcher's rounds are rendered against that launcher's own peers, and an entry that does
not say which launcher is refused in one line."""
import json
from pathlib import Path

import pytest

from bench_module import load_benchmark

REPO = Path(__file__).resolve().parents[2]
performance = load_benchmark("performance")

SET = "cpu_auto_lstm_1gbit_backends_2026-11-28"


def _runs(backend):
    data = json.loads((REPO / "docs/results" / SET / "results.json").read_text())
    return [block["runs"] for block in data["1gbit"][backend].values()]


@pytest.mark.parametrize("backend, peer, name", [("horovod", "horovod_fp16", "Horovod fp16"),
                                                 ("torch", "ddp_powersgd_rank4",
                                                  "DDP PowerSGD rank 4")])
def test_each_launchers_rounds_meet_its_own_peers(backend, peer, name):
    rows = {r["method"]: r for r in performance.e2e_rows(SET, backend)}
    auto = rows["gravac_auto"]
    assert auto["rounds"] == 2 and set(auto["peers"]) == {peer}
    expected = [runs["gravac_auto"]["time_to_target"] / runs[peer]["time_to_target"]
                for runs in _runs(backend)]
    assert auto["vs_peer"] == pytest.approx(expected)
    table = "\n".join(performance.e2e_table({"set": SET, "backend": backend,
                                             "workload": "LSTM", "link": "1 Gbit/s"}))
    assert f"the fastest peer to dense's target loss: {name}." in table
    assert ("ddp_powersgd_rank4" in rows) == (backend == "torch")


def test_a_set_of_two_launchers_must_name_one():
    with pytest.raises(SystemExit, match=f"{SET} holds the backends \\['horovod', 'torch'\\]; "
                                         "give its entry a backend: horovod or torch"):
        performance.e2e_rows(SET)
    with pytest.raises(SystemExit, match="has no backend 'nccl'"):
        performance.e2e_rows(SET, "nccl")


def test_a_one_round_set_is_read_as_its_one_round():
    """A ``--rounds 1`` invocation writes its block without a round's key: it is one
    round, its ratios against that round's own peer."""
    one = "cpu_auto_resnet18_100mbit_2026-11-29"
    runs = json.loads((REPO / "docs/results" / one / "results.json").read_text())
    runs = runs["100mbit"]["torch"]["runs"]
    rows = {r["method"]: r for r in performance.e2e_rows(one)}
    assert rows["gravac_auto"]["rounds"] == 1
    assert rows["gravac_auto"]["vs_peer"] == pytest.approx(
        [runs["gravac_auto"]["time_to_target"] / runs["ddp_powersgd_rank4"]["time_to_target"]])
    table = "\n".join(performance.e2e_table({"set": one, "workload": "ResNet-18",
                                             "link": "100 Mbit/s"}))
    assert "1 round; the fastest peer to dense's target loss: DDP PowerSGD rank 4." in table


def test_the_current_sets_check():
    performance.check_current(performance.load_current())


@pytest.mark.parametrize("change, message", [
    (lambda c: c["readme"].insert(0, {**c["readme"][0], "set": "no_such_set_2026-01-01"}),
     "readme entry 1: no result set docs/results/no_such_set_2026-01-01/"),
    (lambda c: c["readme"].append("no_such_set"),
     "'no_such_set' is not a mapping; write it as {set: NAME, ...}"),
    (lambda c: c["readme"][0].pop("gravac"), "readme entry 1: needs gravac"),
    (lambda c: c["sections"][1]["sets"].append({"set": SET, "file": "nothing.md"}),
     "section 2 ('Compressors against one pass over the tensor'), set 2: set "
     f"{SET} has no nothing.md"),
    (lambda c: c["sections"].append({"title": "x", "kind": "plot"}),
     "needs a title and a kind (e2e, choose, table, gpu, text)"),
])
def test_a_bad_entry_of_current_yaml_is_named_in_one_line(change, message):
    current = performance.load_current()
    change(current)
    with pytest.raises(SystemExit) as stop:
        performance.check_current(current)
    assert message in str(stop.value) and "\n" not in str(stop.value)
    assert str(stop.value).startswith("docs/results/current.yaml: ")


def test_floats_sent_is_the_range_over_the_rounds(tmp_path, monkeypatch):
    """A method that sent 0.101 of dense's floats in one round and 0.842 in the other
    showed 0.101: the lowest round alone."""
    def run(sps, ttt, loss, floats):
        return {"samples_per_sec": sps, "time_to_target": ttt, "final_loss": loss,
                "floats_ratio": floats}

    rounds = {f"round{r}": {"target": 3.0, "runs": {
        "dense": run(50.0, 80.0, 3.6, 1.0), "gravac_auto": run(200.0, 20.0, 3.5, floats)}}
        for r, floats in ((1, 0.101), (2, 0.842))}
    (tmp_path / "two_rounds").mkdir()
    (tmp_path / "two_rounds" / "results.json").write_text(
        json.dumps({"1gbit": {"torch": rounds}}))
    monkeypatch.setattr(performance, "RESULTS", tmp_path)
    table = performance.e2e_table({"set": "two_rounds", "workload": "LSTM",
                                   "link": "1 Gbit/s"})
    auto = next(line for line in table if line.startswith("| gravac_auto |"))
    # 200 / 50 samples/s, 20 / 80 s to the target (dense the fastest peer), 3.5 / 3.6 - 1
    assert auto == "| gravac_auto | 4.00x | 0.25x | 0.25x | -2.8% | 0.101-0.842 |"
    dense = next(line for line in table if line.startswith("| dense |"))
    assert dense.endswith("| 1.000 |")
