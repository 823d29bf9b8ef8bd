"""Every train.py command that `train.py --help`, README.md, docs/RELIABILITY.md,
docs/TRAINING.md and docs/USAGE.md show
passes --dry-run: the files they name exist and the configs resolve. Data roots
are pointed at tiny generated CIFAR-10/100 and PTB files; runs go to a temporary folder."""
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from gravac.train.cli import main
from tiny_data import write_cifar10, write_cifar100, write_ptb

REPO = Path(__file__).resolve().parents[2]


def _joined(text: str) -> list[str]:
    """Lines with their backslash continuations joined."""
    return text.replace("\\\n", " ").splitlines()


def train_commands(text: str) -> list[str]:
    """The train.py commands of a help text or a Markdown page (code blocks, inline code)."""
    found = []
    blocks = re.findall(r"```[a-z]*\n(.*?)```", text, re.S)
    for line in [*(ln for b in blocks for ln in _joined(b)),
                 *re.findall(r"`([^`\n]*train\.py --[^`\n]*)`", text)]:
        line = line.split("#", 1)[0].strip()
        # a command to run (with its configs), not a mention such as `train.py --check`
        if re.search(r"(^|[\s/])train\.py\s+--", line) and "--config" in line:
            found.append(line)
    return found


def help_commands() -> list[str]:
    out = subprocess.run([sys.executable, "train.py", "--help"], cwd=REPO, capture_output=True,
                         text=True, timeout=600).stdout
    return [ln.strip() for ln in _joined(out)
            if re.search(r"(^|[\s/])train\.py\s+--", ln)]


COMMANDS = sorted(set(help_commands()
                      + train_commands((REPO / "README.md").read_text())
                      + train_commands((REPO / "docs/RELIABILITY.md").read_text())
                      + train_commands((REPO / "docs/TRAINING.md").read_text())
                      + train_commands((REPO / "docs/USAGE.md").read_text())))


def test_the_commands_were_found():
    assert len(COMMANDS) >= 6, COMMANDS
    assert any("resnet101_cifar10.yaml" in c for c in COMMANDS)


@pytest.fixture(scope="module")
def data_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("data")
    write_cifar10(root)
    write_cifar100(root)
    write_ptb(root)
    return root


@pytest.mark.parametrize("command", COMMANDS)
def test_documented_command_dry_runs(command, data_root, tmp_path):
    tokens = shlex.split(command)
    start = next(i for i, t in enumerate(tokens) if t.endswith("train.py"))
    args = [re.sub(r"^data\.root=.*$", f"data.root={data_root}", t)
            for t in tokens[start + 1:]]
    args += ["--set", f"run.output_dir={tmp_path}", "--dry-run"]
    assert main(args) == 0, command
