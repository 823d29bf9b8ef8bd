"""Every file in configs/ resolves and passes --dry-run (data paths on tiny generated data)."""
import subprocess
import sys
from pathlib import Path

import pytest

from gravac.train.cli import main
from tiny_data import write_cifar10, write_cifar100, write_ptb

REPO = Path(__file__).resolve().parents[2]
COMPRESSION = sorted((REPO / "configs/compression").glob("*.yaml"))
MODELS = sorted((REPO / "configs/models").glob("*.yaml"))


@pytest.fixture(scope="module")
def data_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("data")
    write_cifar10(root)
    write_cifar100(root)
    write_ptb(root / "ptb")
    return root


def test_config_folders_are_populated():
    assert {p.stem for p in MODELS} == {"resnet101_cifar10", "vgg16_cifar100", "lstm_ptb"}
    stems = {p.stem for p in COMPRESSION}
    for needed in ["dense", "horovod_fp16", "gravac_exp_dgc_eps07", "gravac_exp_dgc_eps09",
                   "gravac_geo_redsync", "gravac_randomk", "accordion_cnn", "accordion_lstm",
                   "accordion_randomk"]:
        assert needed in stems
    for comp in ["topk", "dgc", "redsync", "randomk"]:
        assert {f"static_{comp}_10x", f"static_{comp}_1000x"} <= stems


@pytest.mark.parametrize("path", COMPRESSION, ids=lambda p: p.stem)
def test_compression_files_dry_run_on_the_demo(path, tmp_path, capsys):
    # DDP's hooks run under torchrun only (refused under Horovod, which this process would
    # detect): dry-run them on one process.
    local = ["--set", "run.backend=local"] if path.stem.startswith("ddp_") else []
    assert main(["--config", str(REPO / "configs/demo.yaml"), str(path), "--dry-run",
                 "--set", f"run.output_dir={tmp_path}", *local]) == 0
    out = capsys.readouterr().out
    assert "compression:" in out and "parameters" in out


@pytest.mark.parametrize("model", MODELS, ids=lambda p: p.stem)
def test_model_files_dry_run_with_dense_and_gravac(model, data_root, tmp_path, capsys):
    root = data_root / "ptb" if "ptb" in model.stem else data_root
    extra = ["--set", f"data.root={root}", "--set", f"run.output_dir={tmp_path}"]
    if "lstm" in model.stem:      # keep the dry run light: the layer sizes are what matter
        extra += ["--set", "model.options.embedding_dim=64", "--set", "model.options.hidden_dim=64"]
    for compression in ("dense.yaml", "gravac_exp_dgc_eps07.yaml"):
        assert main(["--config", str(model), str(REPO / "configs/compression" / compression),
                     "--dry-run", *extra]) == 0
    assert "parameters" in capsys.readouterr().out


def test_demo_dry_run_through_the_command_line(tmp_path):
    proc = subprocess.run([sys.executable, "train.py", "--config", "configs/demo.yaml",
                           "--dry-run", "--set", f"run.output_dir={tmp_path}"],
                          cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert "name: demo" in proc.stdout and "controller: gravac" in proc.stdout
    assert not (tmp_path / "demo").exists(), "a dry run writes nothing"


def test_missing_data_folder_is_a_config_error(tmp_path, capsys):
    code = main(["--config", str(REPO / "configs/models/resnet101_cifar10.yaml"),
                 str(REPO / "configs/compression/dense.yaml"), "--dry-run",
                 "--set", f"data.root={tmp_path}/nowhere"])
    assert code == 2
    err = capsys.readouterr().err
    assert "cifar-10-batches-py" in err and "nowhere" in err


@pytest.mark.parametrize("workload", sorted((REPO / "configs/benchmarks").glob("*.yaml")),
                         ids=lambda p: p.stem)
def test_benchmark_workloads_dry_run_with_every_gravac_variant(workload, tmp_path, capsys):
    sys.path.insert(0, str(REPO / "benchmarks"))
    from end_to_end import METHODS, WORKLOADS

    assert str(workload.relative_to(REPO)) in {w[0] for w in WORKLOADS.values()}
    for name in (m for m in METHODS if m.startswith("gravac")):
        compression, sets = METHODS[name]
        overrides = [arg for s in sets for arg in ("--set", s)]
        if name.endswith("_ddp_hook"):     # torchrun only: its dry run is one process
            overrides += ["--set", "run.backend=local"]
        assert main(["--config", str(workload), str(REPO / "configs/compression" / compression),
                     "--dry-run", "--set", f"run.output_dir={tmp_path}", *overrides]) == 0
    assert "GraVAC(" in capsys.readouterr().out


@pytest.mark.parametrize("model", [m for m in MODELS if "steps:" in m.read_text()],
                         ids=lambda p: p.stem)
def test_paper_model_configs_are_long_enough_for_every_gravac_ladder(model):
    """With no warm-up, a ladder of R rungs measures its top rung in window R-1;
    every step-based paper config must leave at least one more window to train at the
    answer (the paper: 1280x from 16K on, with the geometric ladder and window 2000)."""
    import yaml
    from gravac.controllers import GraVAC

    steps = yaml.safe_load(model.read_text())["run"]["steps"]
    for path in COMPRESSION:
        comp = yaml.safe_load(path.read_text())["compression"]
        if comp.get("controller") != "gravac":
            continue
        ctrl = GraVAC(**comp["gravac"])
        needed = ctrl.window * len(ctrl.ladder)        # R-1 candidate windows + 1 at the answer
        assert steps >= needed, f"{model.name} with {path.name}: {steps} < {needed} steps"
    geo = GraVAC(theta_min=10, theta_max=2000, window=2000, policy="geometric")
    assert geo.window * (len(geo.ladder) - 1) == 16_000    # 2000x measured by 16K


def test_recommended_preset_is_the_paper_setup_plus_the_benchmarked_extensions():
    """configs/compression/gravac_recommended.yaml must be exactly what docs/notes/2026-11-benchmarks.md
    §3d measured as gravac_e1_e2_e3: the paper's gravac_exp_topk.yaml with E1-E3 on (the
    benchmark only shortens the window to fit its 300-step runs)."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    from end_to_end import METHODS
    from gravac.train.config import load_config

    def gravac_of(file, sets):
        return vars(load_config([REPO / "configs/demo.yaml", REPO / "configs/compression" / file],
                                sets).compression.gravac)

    paper = gravac_of("gravac_exp_topk.yaml", [])
    recommended = gravac_of("gravac_recommended.yaml", [])
    changed = {k: v for k, v in recommended.items() if paper.get(k) != v}
    assert changed == {"scale_up": "epsilon", "dense_probe_steps": 5, "settle_dense": True}
    assert (gravac_of(*METHODS["gravac_recommended"])
            == gravac_of(*METHODS["gravac_e1_e2_e3"]))
