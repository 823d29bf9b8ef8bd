"""Bad data files: one line naming the file and what is wrong, exit 2, before
any training. The loaders raise DataFileError; train.py shows it as a config error."""
import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from gravac.data import DataFileError, load_cifar, load_ptb
from gravac.train.config import ConfigError, load_config
from gravac.train.tasks import build_task
from tiny_data import write_cifar10, write_ptb

REPO = Path(__file__).resolve().parents[2]


def _cifar_with(tmp_path, content: bytes):
    write_cifar10(tmp_path)
    bad = tmp_path / "cifar-10-batches-py/data_batch_3"
    bad.write_bytes(content)
    return bad


@pytest.mark.parametrize("content,problem", [
    ("truncated", "ends too early (a truncated download or copy)"),
    (b"this is not a pickle at all", "not a CIFAR batch file (UnpicklingError"),
    (pickle.dumps([1, 2, 3], protocol=2), "not a CIFAR batch file (it holds a list, not a dict)"),
    (pickle.dumps({b"data": 1}, protocol=2), "not a CIFAR batch file: it needs keys 'data' and 'labels', found ['data']"),
    (pickle.dumps({b"data": np.zeros((4, 100), np.uint8), b"labels": [0] * 4}, protocol=2),
     "expected data [N, 3072] and N labels, got data [4, 100] and 4 labels"),
])
def test_bad_cifar_files_name_the_file_and_the_problem(tmp_path, content, problem):
    if content == "truncated":
        write_cifar10(tmp_path)
        good = (tmp_path / "cifar-10-batches-py/data_batch_3").read_bytes()
        content = good[: len(good) // 2]
    bad = _cifar_with(tmp_path, content)
    with pytest.raises(DataFileError) as err:
        load_cifar(tmp_path, "cifar10", train=True)
    assert str(err.value).startswith(f"{bad}: {problem}")
    assert str(err.value).endswith("extract the official cifar-10-python.tar.gz again "
                                   "(the python version)")


def test_bad_ptb_files_name_the_file(tmp_path):
    write_ptb(tmp_path)
    (tmp_path / "ptb.valid.txt").write_text("\n\n")
    with pytest.raises(DataFileError, match=rf"^{tmp_path}/ptb.valid.txt: holds no words"):
        load_ptb(tmp_path)
    write_ptb(tmp_path)
    (tmp_path / "ptb.train.txt").write_bytes(b"\xff\xfe\x00junk")
    with pytest.raises(DataFileError, match=rf"^{tmp_path}/ptb.train.txt: not UTF-8 text"):
        load_ptb(tmp_path)


def test_a_utf8_byte_order_mark_in_ptb_is_not_a_word(tmp_path):
    """A file saved with a BOM (some editors do) gained a word "\\ufeff"."""
    write_ptb(tmp_path)
    plain = load_ptb(tmp_path)
    for name in ("ptb.train.txt", "ptb.valid.txt"):
        path = tmp_path / name
        path.write_bytes(b"\xef\xbb\xbf" + path.read_bytes())
    marked = load_ptb(tmp_path)
    assert marked.dictionary.idx2word == plain.dictionary.idx2word
    assert marked.train.tolist() == plain.train.tolist()
    assert marked.valid.tolist() == plain.valid.tolist()


def test_a_ptb_train_file_shorter_than_one_batch_says_how_many_tokens_it_needs(tmp_path):
    write_ptb(tmp_path, words=60)           # 60 words + <eos> per 12: 65 tokens
    cfg = load_config([str(REPO / "configs/models/lstm_ptb.yaml")],
                      [f"data.root={tmp_path}", f"run.output_dir={tmp_path / 'runs'}",
                       "data.batch_size=20", "data.eval_batch_size=2"])
    with pytest.raises(ConfigError) as err:
        build_task(cfg, rank=0, world_size=2)
    assert str(err.value) == (
        f"data.root={str(tmp_path)!r}: {tmp_path}/ptb.train.txt: 65 tokens, fewer than one "
        "training batch (data.batch_size=20 per rank x 2 ranks x 2 rows) needs (80); use the "
        "full file, or a smaller data.batch_size")


def test_empty_ptb_no_longer_blames_model_options(tmp_path):
    write_ptb(tmp_path)
    (tmp_path / "ptb.train.txt").write_text("")
    cfg = load_config([str(REPO / "configs/models/lstm_ptb.yaml")],
                      [f"data.root={tmp_path}", f"run.output_dir={tmp_path / 'runs'}"])
    with pytest.raises(ConfigError, match=r"ptb.train.txt: holds no words \(empty\)") as err:
        build_task(cfg, rank=0, world_size=1)
    assert "model.options" not in str(err.value)


def test_train_py_with_a_truncated_cifar_file_exits_2_in_one_line(tmp_path):
    write_cifar10(tmp_path)
    bad = tmp_path / "cifar-10-batches-py/test_batch"
    bad.write_bytes(bad.read_bytes()[:1000])
    proc = subprocess.run([sys.executable, "train.py", "--config",
                           "configs/models/resnet101_cifar10.yaml", "--set",
                           f"data.root={tmp_path}", "--set", f"run.output_dir={tmp_path / 'r'}",
                           "--set", "run.backend=local", "--set", "model.name=small_cnn",
                           "--set", "model.options={in_channels: 3, image_size: 32}",
                           "--set", "run.steps=2"],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and f"{bad}: ends too early" in lines[0]
    assert not (tmp_path / "r").exists() or not any((tmp_path / "r").rglob("metrics.jsonl"))


@pytest.mark.parametrize("model, holds", [("resnet101_cifar10", "cifar-10-batches-py/"),
                                          ("lstm_ptb", "ptb.train.txt, ptb.valid.txt")])
def test_a_data_root_that_is_a_file_is_named_as_one(model, holds, tmp_path):
    """It was reported as a folder not found inside it."""
    root = tmp_path / "cifar-10-python.tar.gz"
    root.write_bytes(b"not a folder")
    cfg = load_config([str(Path(__file__).resolve().parents[2] / f"configs/models/{model}.yaml")],
                      [f"data.root={root}"])
    with pytest.raises(ConfigError) as err:
        build_task(cfg, rank=0, world_size=1)
    assert str(err.value).startswith(f"data.root={str(root)!r}: a file, not a folder; give the "
                                     f"folder that holds {holds}")
