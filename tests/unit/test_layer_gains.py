"""benchmarks/layer_gains.py: its compressors against exact answers, its split against a
hand-computed one, and one short measurement of a workload."""
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))
from layer_gains import PowerSGD, TopK, best_split, main, measure, parse_method  # noqa: E402


def test_topk_keeps_exactly_the_largest_values():
    g = torch.tensor([[0.5, -3.0, 1.0], [2.0, -0.1, 0.0]])
    kept = TopK(3.0)("w", g)                          # 6 values at CF 3: 2 kept
    assert torch.equal(kept, torch.tensor([[0.0, -3.0, 0.0], [2.0, 0.0, 0.0]]))


def test_powersgd_at_full_rank_reproduces_the_matrix_and_a_rank_1_matrix_at_rank_1():
    g = torch.randn(6, 4, generator=torch.Generator().manual_seed(0))
    assert torch.allclose(PowerSGD(4)("w", g), g, atol=1e-5)
    u, v = torch.randn(6, 1), torch.randn(1, 4)
    assert torch.allclose(PowerSGD(1)("w", u @ v), u @ v, atol=1e-5)
    assert not PowerSGD(4).compresses((6, 4)) and PowerSGD(1).compresses((100, 100))


def test_the_split_compresses_the_layers_above_epsilon_and_those_their_slack_carries():
    rows = [  # gains 0.9, 0.6, 0.3 with equal energy; ε 0.7
        {"layer": "a", "numel": 1000, "gain": 0.9, "energy_share": 0.3, "sent_bytes": 200,
         "compressed": True},
        {"layer": "b", "numel": 1000, "gain": 0.6, "energy_share": 0.3, "sent_bytes": 200,
         "compressed": True},
        {"layer": "c", "numel": 1000, "gain": 0.3, "energy_share": 0.3, "sent_bytes": 200,
         "compressed": True},
        {"layer": "bias", "numel": 10, "gain": 1.0, "energy_share": 0.1, "sent_bytes": 40,
         "compressed": False}]
    split = best_split(rows, epsilon=0.7)
    assert split["whole_gain"] == pytest.approx(0.6)           # (0.9 + 0.6 + 0.3) / 3
    # a's slack 0.2 x 0.3 carries b (0.1 x 0.3), not c (0.4 x 0.3): gain (0.9 + 0.6) / 2.
    assert split["split_layers"] == ["a", "b"]
    assert split["split_gain"] == pytest.approx(0.75)
    assert split["split_model_gain"] == pytest.approx(1 - 0.1 * 0.3 - 0.4 * 0.3)
    assert split["split_bytes_vs_dense"] == pytest.approx((200 + 200 + 4000 + 40) / 12040)


def test_no_split_when_no_layer_reaches_epsilon():
    rows = [{"layer": "a", "numel": 1000, "gain": 0.6, "energy_share": 1.0, "sent_bytes": 200,
             "compressed": True}]
    split = best_split(rows, epsilon=0.7)
    assert split["split_layers"] == [] and split["split_gain"] is None
    assert split["split_bytes_vs_dense"] == 1.0


def test_bad_methods_are_refused_before_training(capsys):
    with pytest.raises(SystemExit, match="sparse:CF or powersgd:RANK"):
        parse_method("fp16")
    with pytest.raises(SystemExit):
        main(["--methods", "topk:10", "--workloads", "wide_cnn"])


def test_a_short_measurement_of_the_wide_cnn():
    out = measure("wide_cnn", steps=3, measure_steps=2, methods=["sparse:10", "powersgd:4"])
    for rows in out["methods"].values():
        assert sum(r["energy_share"] for r in rows) == pytest.approx(1.0)
        assert all(0.0 <= r["gain"] <= 1.0 + 1e-9 for r in rows)
    topk = {r["layer"]: r for r in out["methods"]["sparse:10"]}
    assert topk["fc1.weight"]["sent_bytes"] == 8 * (1024 * 2048 // 10 + 1)


@pytest.mark.parametrize("epsilon", ["0", "2", "-0.5"])
def test_epsilon_outside_0_1_is_refused_before_training(epsilon, capsys):
    with pytest.raises(SystemExit):
        main(["--epsilon", epsilon, "--workloads", "wide_cnn"])
    assert f"argument --epsilon: must be in (0, 1] (a share of the energy), got " \
        f"{float(epsilon):g}" in capsys.readouterr().err
