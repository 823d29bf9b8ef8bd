"""docs/CONFIG.md is what gravac/train/config_doc.py renders from the config's own
definitions: every key of a config file, each with its meaning written beside it."""
from pathlib import Path

from gravac.train.config import Config, to_dict
from gravac.train.config_doc import entries, render

REPO = Path(__file__).resolve().parents[2]


def _leaf_keys(tree: dict, prefix: str = "") -> list[str]:
    keys = []
    for name, value in tree.items():
        if isinstance(value, dict) and name not in ("options", "compressor_options"):
            keys += _leaf_keys(value, f"{prefix}{name}.")
        else:
            keys.append(prefix + name)
    return keys


def test_config_md_is_regenerated_from_the_definitions():
    assert (REPO / "docs/CONFIG.md").read_text() == render(), (
        "docs/CONFIG.md is out of date: run .venv/bin/python -m gravac.train.config_doc "
        "> docs/CONFIG.md")


def test_every_key_of_a_config_file_is_documented_with_a_meaning():
    rows = {key: meaning for key, _, _, meaning in entries()}
    assert sorted(rows) == sorted(_leaf_keys(to_dict(Config())))
    assert [key for key, meaning in rows.items() if not meaning.strip()] == []
