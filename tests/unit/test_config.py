"""Config loading: merging, --set overrides, typed validation, one-line errors."""
import os
import re
from pathlib import Path

import pytest

from gravac.train.config import ConfigError, build_controller, load_config, parse_override

REPO = Path(__file__).resolve().parents[2]


def _write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    return path


def test_later_files_and_set_override_earlier(tmp_path):
    a = _write(tmp_path, "a.yaml", "run: {steps: 10, seed: 1}\noptimizer: {lr: 0.1, momentum: 0.5}\n")
    b = _write(tmp_path, "b.yaml", "optimizer: {lr: 0.2}\ncompression: {controller: gravac, gravac: {window: 7}}\n")
    cfg = load_config([a, b], ["optimizer.momentum=0.8", "compression.gravac.epsilon=0.9",
                               "optimizer.lr_milestones=[5, 8]"])
    assert cfg.run.steps == 10 and cfg.run.seed == 1
    assert cfg.optimizer.lr == 0.2 and cfg.optimizer.momentum == 0.8
    assert cfg.optimizer.lr_milestones == [5, 8]
    assert cfg.compression.gravac.window == 7 and cfg.compression.gravac.epsilon == 0.9
    assert cfg.compression.gravac.theta_max == 1000          # default kept
    assert cfg.run.name == "small_cnn-digits-gravac"          # name from placeholders


def test_set_takes_several_overrides_after_one_flag_and_stays_repeatable():
    from gravac.train.cli import parse_args

    args = parse_args(["--config", "a.yaml", "b.yaml", "--set", "run.steps=5", "optimizer.lr=0.1",
                       "--set", "run.name=x", "--dry-run"])
    assert args.config == ["a.yaml", "b.yaml"] and args.dry_run
    assert args.overrides == ["run.steps=5", "optimizer.lr=0.1", "run.name=x"]
    assert parse_args(["--config", "a.yaml"]).overrides == []
    # --config repeated adds its files (before: the last one alone was loaded).
    assert parse_args(["--config", "a.yaml", "--config", "b.yaml"]).config == ["a.yaml", "b.yaml"]
    assert parse_args(["--config", "a.yaml", "--check"]).check == ""
    assert parse_args(["--config", "a.yaml", "--check", "torchrun"]).check == "torchrun"
    assert parse_args(["--config", "a.yaml"]).check is None
    with pytest.raises(SystemExit):
        parse_args(["--config", "a.yaml", "--check", "mpirun"])


def test_set_parses_yaml_values_without_eval():
    assert parse_override("a.b=1e-4") == {"a": {"b": "1e-4"}}   # coerced to float later
    assert parse_override("x=__import__('os')") == {"x": "__import__('os')"}
    assert parse_override("x=null") == {"x": None}
    with pytest.raises(ConfigError, match="KEY=VALUE"):
        parse_override("run.steps")


@pytest.mark.parametrize("overrides,message", [
    (["run.stpes=3"], r"unknown key 'run.stpes' \(did you mean run.steps\?\); known keys of run: "
                      "name, tag, output_dir"),
    (["run.steps=abc"], "run.steps='abc': expected an int or null"),
    (["run.steps=0"], "run.steps=0: must be >= 1"),
    (["run.steps=5", "run.epochs=2"], "set exactly one of run.steps and run.epochs"),
    (["run.steps=5", "optimizer.lr=-1"], r"optimizer.lr=-1.0: must be > 0"),
    (["run.steps=5", "optimizer.momentum=1.5"], r"optimizer.momentum=1.5: must be in \[0, 1\)"),
    (["run.steps=5", "data.name=imagenet"], "data.name='imagenet': must be one of digits, cifar10"),
    (["run.steps=5", "compression.controller=magic"], "compression.controller='magic': must be one of"),
    (["run.steps=5", "compression.compressor=top_k"],
     "compression.compressor='top_k': must be one of topk, dgc, redsync, randomk, none, powersgd"),
    # A name in another case passed the rules that compare names, then failed in the engine.
    (["run.steps=5", "compression.compressor=PowerSGD", "compression.overlap=true"],
     "compression.compressor='PowerSGD': must be one of topk"),
    (["run.steps=5", "compression.compressor_options={sample_fraction: 2}"],
     r"compression.compressor_options=\{'sample_fraction': 2\} \(compressor topk\): topk: "
     "sample_fraction must be"),
    (["run.steps=5", "compression.compressor_options={foo: 2}"],
     r"compression.compressor_options=\{'foo': 2\} \(compressor topk\): unknown option"),
    # PyTorch DDP's options where the transport is Horovod's: the hook would not exist.
    (["run.steps=5", "run.backend=horovod", "compression.front_end=ddp_hook"],
     "compression.front_end='ddp_hook': PyTorch DDP runs on torch.distributed"),
    (["run.steps=5", "run.backend=horovod", "compression.controller=dense",
      "compression.ddp_powersgd_rank=4"],
     "compression.ddp_powersgd_rank=4: PyTorch DDP runs on torch.distributed .* with "
     "horovodrun use compressor: powersgd"),
    (["run.steps=5", "compression.controller=gravac", "compression.gravac.omega=-1"],
     "compression.gravac.omega=-1.0: omega must be a number >= 0"),
    (["run.steps=5", "compression.controller=static", "compression.cf=0.5"],
     r"compression.cf=0.5: cf must be a number >= 1"),
    (["run.steps=5", "compression.horovod_compression=fp16"],
     "unknown key 'compression.horovod_compression': it is now compression.dense_wire"),
    (["run.steps=5", "model.name=lstm"], "does not fit data.name='digits'"),
    (["run.steps=5", "data.name=cifar10", "model.name=resnet18"], "data.root=null: must point at"),
    (["run.steps=5", "nonsense.key=1"], "unknown key 'nonsense'; known keys: run, model, data"),
    (["run.steps=5", "optimizer.lr_milestones=[9, 3]"], "must be increasing"),
    (["run.steps=5", "optimizer.lr_warmup_steps=-1"], r"optimizer.lr_warmup_steps=-1: must be >= 0"),
    (["run.steps=5", "optimizer.lr_warmup_start=0"], r"optimizer.lr_warmup_start=0.0: must be in \(0, 1\]"),
    (["run.steps=5", 'run.name="x-{modle}"'], "placeholders may only be"),
    # infinite / NaN numbers, a sparsifier-less compressed controller
    (["run.steps=5", "optimizer.lr=.inf"], r"optimizer.lr=inf: must be a finite number"),
    (["run.steps=5", "optimizer.lr=.nan"], r"optimizer.lr=nan: must be a finite number"),
    (["run.steps=5", "compression.gravac.epsilon=inf"],
     r"compression.gravac.epsilon='inf': must be a finite number"),
    (["run.steps=5", "compression.controller=gravac", "compression.compressor=none"],
     "compression.compressor='none': compression.controller=gravac needs a sparsifier"),
    (["run.steps=5", "compression.controller=accordion", "compression.compressor=none"],
     "compression.controller=accordion needs a sparsifier"),
    # overlap with backward
    (["run.steps=5", "compression.controller=dense", "compression.overlap=true"],
     "compression.overlap=true: applies to gravac's optimizer"),
    (["run.steps=5", "compression.controller=static", "compression.compressor=powersgd",
      "compression.rank=2", "compression.overlap=true"], "PowerSGD's rounds"),
    (["run.steps=5", "compression.overlap=true", "compression.bucket_cap_mb=0"],
     r"compression.bucket_cap_mb=0.0: must be a number > 0"),
    (["run.steps=5", "compression.controller=gravac", "compression.gravac.decide=later"],
     "decide"),
    # exchanges
    (["run.steps=5", "compression.exchange=ring"],
     "compression.exchange='ring': must be one of allgather, allgather_coded, hierarchical, shared_index"),
    (["run.steps=5", "compression.controller=dense", "compression.exchange=shared_index"],
     "compression.exchange='shared_index': moves sparse selections"),
    (["run.steps=5", "compression.controller=static", "compression.compressor=powersgd",
      "compression.rank=2", "compression.exchange=hierarchical"], "moves sparse selections"),
    (["run.steps=5", "compression.exchange=shared_index", "compression.overlap=true"],
     "compression.exchange='shared_index': cannot be combined with overlap=true"),
    (["run.steps=5", "compression.exchange=hierarchical", "run.elastic=true"],
     "cannot be combined with run.elastic=true: its host groups"),
    (["run.steps=5", "compression.controller=auto", "compression.auto.methods=[dense, sparse:10@ring]"],
     r"compression.auto.methods='sparse:10@ring': names exchange 'ring'"),
    (["run.steps=5", "compression.controller=auto", "run.elastic=true",
      "compression.auto.methods=[dense, sparse:10@hierarchical]"],
     r"compression.auto.methods=\['dense', 'sparse:10@hierarchical'\]: cannot name @hierarchical"),
    (["run.steps=5", "run.horovod_wait=busy"],
     "run.horovod_wait='busy': must be one of auto, sleep, spin"),
])
def test_errors_name_key_value_and_what_is_allowed(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_config([], overrides)


@pytest.mark.parametrize("overrides,hint", [
    # a letter too few or too many, in a key or a section
    (["compression.controler=gravac"], "unknown key 'compression.controler' (did you mean "
                                       "compression.controller?)"),
    (["compresion.cf=10"], "unknown key 'compresion' (did you mean compression?)"),
    (["run.step=5"], "unknown key 'run.step' (did you mean run.steps?)"),
    (["compression.gravac.windw=20"], "(did you mean compression.gravac.window?)"),
    # a key at the wrong level: the section it belongs to (each, where several have it)
    (["cf=10"], "unknown key 'cf' (did you mean compression.cf?)"),
    (["compression.window=20"], "(did you mean compression.gravac.window?)"),
    (["epsilon=0.5"], "(did you mean compression.gravac.epsilon or compression.auto.epsilon?)"),
    # a value in another case or with a separator the name lacks, or a letter off
    (["compression.controller=GraVAC"], "must be one of dense, static, gravac, accordion, "
                                        "auto; did you mean gravac?"),
    (["compression.compressor=top-k"], "; did you mean topk?"),
    (["compression.exchange=all_gather"], "; did you mean allgather?"),
    (["model.name=resnet-18"], "; did you mean resnet18?"),
    (["run.backend=Horovod"], "; did you mean horovod?"),
    (["compression.nonfinite=skp"], "; did you mean skip?"),
    (["compression.gravac.policy=exponentail"], "policy must be one of exponential, geometric; "
                                                "did you mean exponential?"),
    (["compression.controller=auto", "compression.auto.methods=[dense, sprase:10]"],
     "; did you mean sparse?"),
])
def test_a_near_miss_of_a_key_or_value_names_what_was_meant(overrides, hint):
    with pytest.raises(ConfigError) as err:
        load_config([], ["run.steps=5", *overrides])
    assert hint in str(err.value)


@pytest.mark.parametrize("overrides", [["compression.controller=magic"], ["run.progress=bar"],
                                       ["compression.exchange=ring"], ["nonsense.key=1"]])
def test_a_name_like_none_of_the_known_suggests_nothing(overrides):
    with pytest.raises(ConfigError) as err:
        load_config([], ["run.steps=5", *overrides])
    assert "did you mean" not in str(err.value)


def test_missing_and_malformed_files(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        load_config([tmp_path / "nope.yaml"])
    with pytest.raises(ConfigError, match="is a folder; name the YAML files in it"):
        load_config([tmp_path])
    bad = _write(tmp_path, "bad.yaml", "run: [1, 2\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config([bad])
    scalar = _write(tmp_path, "s.yaml", "42\n")
    with pytest.raises(ConfigError, match="must hold a mapping"):
        load_config([scalar])


def test_yaml_errors_name_file_line_and_column(tmp_path):
    bad = _write(tmp_path, "bad.yaml", "run:\n  steps: 5\n  name: a: b\n")
    with pytest.raises(ConfigError) as err:
        load_config([bad])
    assert str(err.value) == (f"{bad}:3:10: not valid YAML: mapping values are not allowed "
                              "here")


def test_a_key_given_twice_in_a_file_is_refused_at_the_second(tmp_path):
    # PyYAML keeps the last of two `run:` sections silently: the first's steps were lost
    # and the error blamed run.steps=null, which the file visibly sets.
    dup = _write(tmp_path, "dup.yaml", "run:\n  steps: 5\noptimizer: {lr: 0.1}\nrun:\n  seed: 3\n")
    with pytest.raises(ConfigError) as err:
        load_config([dup])
    assert str(err.value) == (f"{dup}:4:1: not valid YAML: found duplicate key 'run' (first on "
                              "line 1); merge the two into one")
    inner = _write(tmp_path, "inner.yaml", "run: {steps: 5, steps: 6}\n")
    with pytest.raises(ConfigError, match="duplicate key 'steps'"):
        load_config([inner])
    # a key beside a "<<:" merge overrides the merged one, as YAML means
    merged = _write(tmp_path, "merged.yaml", "x: &base {steps: 5, seed: 1}\n")
    from gravac.util import yaml_strict
    assert yaml_strict.load(merged.read_text() + "run: {<<: *base, seed: 2}\n")["run"] == \
        {"steps": 5, "seed": 2}


def test_output_path_blocked_by_a_file_is_a_config_error(tmp_path):
    blocker = _write(tmp_path, "runs", "not a folder")
    with pytest.raises(ConfigError, match=rf"run.output_dir='{blocker}': '{blocker}' is a file"):
        load_config([], ["run.steps=5", f"run.output_dir={blocker}"])
    (tmp_path / "out").mkdir()
    _write(tmp_path / "out", "myrun", "")
    with pytest.raises(ConfigError, match=r"out/myrun' is a file, not a folder"):
        load_config([], ["run.steps=5", f"run.output_dir={tmp_path / 'out'}", "run.name=myrun"])
    with pytest.raises(ConfigError, match=r"runs' is a file"):     # a parent is the file
        load_config([], ["run.steps=5", f"run.output_dir={blocker / 'deeper'}"])
    assert load_config([], ["run.steps=5", f"run.output_dir={tmp_path / 'new' / 'x'}"])


@pytest.fixture(scope="module")
def train_py(tmp_path_factory):
    """train.py's command line: {case: CompletedProcess} of the cases below, all run in one
    python process (tests/script_batch.py), each as a process of its own would run it."""
    from script_batch import run_scripts

    blocker = _write(tmp_path_factory.mktemp("blocked"), "runs", "")
    cases = {
        "help": ["train.py", "--help"],
        "config error": ["train.py", "--config", "configs/demo.yaml", "--set", "optimizer.lr=fast"],
        "blocked dry run": ["train.py", "--config", "configs/demo.yaml",
                            "--set", f"run.output_dir={blocker}", "--dry-run"],
        "blocked run": ["train.py", "--config", "configs/demo.yaml",
                        "--set", f"run.output_dir={blocker}"],
    }
    done = run_scripts([(REPO, argv) for argv in cases.values()], timeout=300)
    return dict(zip(cases, done))


def test_cli_blocked_output_dir_exits_2_in_dry_run_and_real_run(train_py):
    for proc in (train_py["blocked dry run"], train_py["blocked run"]):
        assert proc.returncode == 2, proc.stderr
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and "is a file, not a folder" in lines[0]


def test_tilde_in_paths_is_expanded(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    _write(tmp_path, "c.yaml", "run: {steps: 3}\n")
    cfg = load_config(["~/c.yaml"], ["run.output_dir=~/runs", "data.root=~/data"])
    assert cfg.run.steps == 3
    assert cfg.run.output_dir == str(tmp_path / "runs") and cfg.data.root == str(tmp_path / "data")


def test_cli_config_error_exits_2_with_one_line(train_py):
    proc = train_py["config error"]
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("config error: optimizer.lr='fast'")


def test_cli_help_explains_every_option(train_py):
    proc = train_py["help"]
    assert proc.returncode == 0
    for option in ("--config", "--set", "--dry-run", "--resume"):
        assert option in proc.stdout


def test_controller_sections_are_the_controllers_own_options():
    # The config reads each controller's options, types and defaults from its constructor:
    # a hand-written copy (which drifted before) would fail here.
    import dataclasses
    import inspect

    from gravac.controllers import Accordion, Auto, GraVAC, Static
    from gravac.train.config import AccordionConfig, AutoConfig, CompressionConfig, GraVACConfig

    for section, component in ((GraVACConfig, GraVAC), (AccordionConfig, Accordion),
                               (AutoConfig, Auto)):
        params = {n: p for n, p in inspect.signature(component).parameters.items()}
        assert [f.name for f in dataclasses.fields(section)] == list(params)
        assert {f.name: f.default for f in dataclasses.fields(section)} == \
            {n: p.default for n, p in params.items()}
    assert CompressionConfig().cf == inspect.signature(Static).parameters["cf"].default
    cfg = load_config([str(REPO / "configs/demo.yaml")], ["compression.controller=accordion"])
    assert build_controller(cfg.compression).describe() == Accordion().describe()


def test_every_config_file_named_in_help_and_docstrings_exists(train_py):
    # train.py --help and the config modules' examples are what a new user copies first.
    import re

    from gravac.train import cli, config

    assert train_py["help"].returncode == 0, train_py["help"].stderr
    help_text = train_py["help"].stdout
    texts = [help_text, cli.__doc__, config.__doc__, (REPO / "train.py").read_text()]
    named = {m for text in texts for m in re.findall(r"configs/[\w./-]+\.yaml", text)}
    assert named, "the help should show at least one config file"
    missing = sorted(p for p in named if not (REPO / p).is_file())
    assert not missing, f"named but missing: {missing}"


def test_controller_auto_from_a_config_and_its_errors_name_the_key():
    from gravac.controllers import Auto
    files = [str(REPO / "configs/demo.yaml"), str(REPO / "configs/compression/auto.yaml")]
    cfg = load_config(files, ["compression.auto.methods=[dense, fp16, powersgd:2, sparse:40]"])
    ctrl = build_controller(cfg.compression)
    assert isinstance(ctrl, Auto)
    assert [m.key for m in ctrl.methods] == ["dense", "fp16", "powersgd:2", "sparse:40"]
    for sets, message in (
            (["compression.auto.methods=[fp16]"], "compression.auto.methods="),
            (["compression.auto.trial_steps=0"], "compression.auto.trial_steps=0"),
            (["compression.compressor=powersgd"], "compression.compressor='powersgd': "
                                                  "controller Auto")):
        with pytest.raises(ConfigError, match=re.escape(message)):
            load_config(files, sets)
    # Overlap applies to the steps whose method's exchange overlaps.
    assert load_config(files, ["compression.overlap=true"]).compression.overlap


@pytest.mark.parametrize("controller", ["dense", "static", "gravac", "accordion", "auto"])
def test_a_bad_value_in_any_controllers_section_is_refused_whichever_runs(controller):
    """A sweep axis or a --set of compression.controller turns another section on: its
    bad value is named now, not after the runs before it."""
    base = [str(REPO / "configs/demo.yaml")]
    sets = [f"compression.controller={controller}"] + \
        (["compression.cf=10"] if controller == "static" else [])
    load_config(base, sets)
    for bad, message in ((["compression.auto.methods=[sparse:10]"],
                          "compression.auto.methods=['sparse:10']: must include 'dense'"),
                         (["compression.auto.epsilon=2"],
                          "compression.auto.epsilon=2.0: must be in (0, 1]"),
                         (["compression.accordion.eta=-1"],
                          "compression.accordion.eta=-1.0: eta must be a number > 0"),
                         (["compression.gravac.window=0"], "compression.gravac.window=0: ")):
        with pytest.raises(ConfigError, match="^" + re.escape(message)):
            load_config(base, sets + bad)


# -- run.backend against the launcher -----------------------------------------
TORCHRUN_ENV = {"TORCHELASTIC_RUN_ID": "x", "LOCAL_RANK": "0", "WORLD_SIZE": "2"}
HOROVODRUN_ENV = {"HOROVOD_RANK": "0", "HOROVOD_SIZE": "2"}


@pytest.mark.parametrize("environ, backend, fix", [
    (TORCHRUN_ENV, "horovod", "set run.backend=torch, or launch with horovodrun"),
    (TORCHRUN_ENV, "local", "set run.backend=torch, or run train.py without a launcher"),
    (HOROVODRUN_ENV, "torch", "set run.backend=horovod, or launch with torchrun"),
    (HOROVODRUN_ENV, "local", "set run.backend=horovod, or run train.py without a launcher"),
])
def test_a_backend_other_than_the_launchers_is_refused(environ, backend, fix):
    from gravac.train.config import check_launcher

    cfg = load_config([REPO / "configs/demo.yaml"], [f"run.backend={backend}"])
    launcher = "torchrun" if environ is TORCHRUN_ENV else "horovodrun"
    with pytest.raises(ConfigError) as err:
        check_launcher(cfg, environ)
    assert str(err.value).startswith(f"run.backend='{backend}' does not match {launcher}, "
                                     "which started this process")
    assert str(err.value).endswith(f"drop run.backend (auto follows the launcher), {fix}")


@pytest.mark.parametrize("environ, backend", [
    (TORCHRUN_ENV, "torch"), (TORCHRUN_ENV, "auto"), (HOROVODRUN_ENV, "horovod"),
    (HOROVODRUN_ENV, "auto"), ({}, "torch"), ({}, "horovod"), ({}, "local")])
def test_the_launchers_backend_and_no_launcher_are_accepted(environ, backend):
    from gravac.train.config import check_launcher

    check_launcher(load_config([REPO / "configs/demo.yaml"], [f"run.backend={backend}"]),
                   environ)


@pytest.mark.parametrize("argv", [["--dry-run"], []])
def test_backend_torch_without_torchrun_is_one_line_not_a_traceback(argv, capsys, monkeypatch,
                                                                    tmp_path):
    from gravac.train.cli import main

    for name in ("MASTER_ADDR", "TORCHELASTIC_RUN_ID", "LOCAL_RANK", "HOROVOD_RANK",
                 "OMPI_COMM_WORLD_RANK"):
        monkeypatch.delenv(name, raising=False)
    demo = str(REPO / "configs" / "demo.yaml")
    assert main(["--config", demo, "--set", "run.backend=torch", f"run.output_dir={tmp_path}",
                 *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("config error: run.backend='torch' needs a "
                                               "torchrun launch") and "run.backend=local" in err[0]
    assert list(tmp_path.iterdir()) == []
    # a check announces the launch to come: torchrun will give the rendezvous then
    assert main(["--config", demo, "--set", "run.backend=torch", f"run.output_dir={tmp_path}",
                 "--check"]) == 0


@pytest.mark.parametrize("extra", [["compression.front_end=ddp_hook"],
                                   ["compression.controller=dense",
                                    "compression.ddp_powersgd_rank=4"]])
def test_ddp_options_are_refused_where_horovod_will_run_the_job(extra):
    # Under horovodrun (or `--check horovodrun`, what run_single_node.sh runs first) with
    # run.backend=auto; accepted under torchrun, without a launcher (--dry-run, --check)
    # and on the one-process local transport.
    from gravac.train.config import check_launcher

    cfg = load_config([REPO / "configs/demo.yaml"], extra)
    for kwargs in ({"environ": HOROVODRUN_ENV}, {"environ": {}, "launcher": "horovodrun"}):
        with pytest.raises(ConfigError, match="PyTorch DDP runs on torch.distributed"):
            check_launcher(cfg, **kwargs)
    check_launcher(cfg, TORCHRUN_ENV)
    check_launcher(cfg, {}, launcher="torchrun")
    check_launcher(cfg, {})
    check_launcher(load_config([REPO / "configs/demo.yaml"], [*extra, "run.backend=local"]), {})


def test_dry_run_of_a_ddp_config_without_a_launcher_is_one_line(capsys):
    # run.backend=auto without a launcher builds on Horovod where it is installed.
    from gravac.train.cli import main

    pytest.importorskip("horovod.torch")
    assert main(["--config", str(REPO / "configs/demo.yaml"),
                 str(REPO / "configs/compression/ddp_powersgd_rank4.yaml"), "--dry-run"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("config error: compression.ddp_powersgd_rank=4")
    assert err[0].endswith("to dry-run it in one process, --set run.backend=local")


def test_torchrun_with_backend_horovod_stops_before_any_run_starts(tmp_path):
    """Before: two 1-rank Horovod jobs trained into one run folder."""
    import subprocess
    import sys

    torchrun = Path(sys.executable).parent / "torchrun"
    proc = subprocess.run([str(torchrun), "--standalone", "--nproc-per-node", "2", "train.py",
                           "--config", "configs/demo.yaml", "--set", "run.backend=horovod",
                           "--set", f"run.output_dir={tmp_path}", "--set", "run.name=r",
                           "--set", "run.steps=2"],
                          cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode != 0
    line = ("config error: run.backend='horovod' does not match torchrun, which started this "
            "process")
    # Every rank refuses; the first to exit makes torchrun stop the other, which may not
    # have printed its line yet (seen on a loaded machine): at least one line, no run.
    assert proc.stderr.count(line) >= 1, proc.stdout + proc.stderr
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("sets", [["compression.exchange=hierarchical"],
                                  ["compression.controller=auto",
                                   "compression.auto.methods=[dense, sparse:10@hierarchical]"]])
def test_a_run_that_may_build_the_hierarchical_exchange_gets_horovods_process_sets(
        sets, monkeypatch):
    """An Auto method naming @hierarchical builds its host groups at its first step, long
    after hvd.init() read the variable."""
    from gravac.train.method import prepare_environment
    monkeypatch.delenv("HOROVOD_DYNAMIC_PROCESS_SETS", raising=False)
    prepare_environment(load_config([], ["run.steps=5", *sets]))
    assert os.environ.get("HOROVOD_DYNAMIC_PROCESS_SETS") == "1"


@pytest.mark.parametrize("sets, message", [
    (["model.options={num_clases: 3}"], "allowed: num_classes, in_channels, image_size; did you "
                                        "mean num_classes?"),
    (["data.name=synthetic_images", "data.options={num_trian: 3}"], "did you mean num_train?"),
    (["compression.compressor=dgc", "compression.compressor_options={sample_fractoin: 0.1}"],
     "did you mean sample_fraction?"),
])
def test_a_misspelt_model_data_or_compressor_option_is_named_with_the_one_meant(sets, message):
    from gravac.train.cli import main
    import contextlib
    import io

    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        code = main(["--config", str(REPO / "configs/demo.yaml"), "--set", "run.backend=local",
                     *sets, "--dry-run"])
    assert code == 2 and message in err.getvalue(), err.getvalue()
