"""YAML as the config and sweep files are read: PyYAML's safe loader, refusing a key that
one mapping gives twice.

YAML forbids duplicate keys, but PyYAML keeps the last one silently: a file with two
``run:`` sections (the second added at the end for a quick change) loses every key of
the first, and the run then fails on, or worse runs without, a key the user can see in
the file. The error names the line of the second key, as a YAML syntax error does.

Example::

    load("run: {steps: 5}\\nrun: {seed: 1}\\n")
    # yaml.constructor.ConstructorError: ... found duplicate key 'run' (first on line 1)
"""
from __future__ import annotations

import yaml

_MERGE = "tag:yaml.org,2002:merge"


class _UniqueKeyLoader(yaml.SafeLoader):
    pass


def _construct_mapping(loader: _UniqueKeyLoader, node: yaml.MappingNode, deep: bool = False):
    first_line = {}
    for key_node, _ in node.value:
        # "<<: *anchor" merges: a key written beside it overrides the merged one, as YAML means
        if key_node.tag == _MERGE or not isinstance(key_node, yaml.ScalarNode):
            continue
        key = (key_node.tag, key_node.value)
        if key in first_line:
            raise yaml.constructor.ConstructorError(
                None, None, f"found duplicate key {key_node.value!r} (first on line "
                f"{first_line[key] + 1}); merge the two into one", key_node.start_mark)
        first_line[key] = key_node.start_mark.line
    return loader.construct_mapping(node, deep)


_UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG,
                                 _construct_mapping)


def load(text: str):
    """``yaml.safe_load(text)``, but a key given twice in one mapping raises
    ``yaml.constructor.ConstructorError`` (a ``yaml.YAMLError``) at the second one."""
    return yaml.load(text, Loader=_UniqueKeyLoader)


def error_where(path, exc: yaml.YAMLError) -> str:
    """``file:line:column`` of a YAML error (1-based, as editors count), or the file alone."""
    mark = getattr(exc, "problem_mark", None)
    return f"{path}:{mark.line + 1}:{mark.column + 1}" if mark is not None else str(path)


def problem(exc: yaml.YAMLError) -> str:
    """The YAML error's problem in a few words ("mapping values are not allowed here")."""
    what = getattr(exc, "problem", None)
    context = getattr(exc, "context", None)
    if what:
        return f"{context}, {what}" if context else what
    return str(exc).splitlines()[0]
