"""The Python a user copies: every ```python block of README.md and docs/*.md, and every
``::`` example in the docstrings of the public entry points, compiles; every gravac name it
uses (``gravac.x.y``, ``from gravac.x import y``, ``y.z`` of a name imported from gravac)
exists, so a renamed API breaks this test before it breaks a reader's script; and a
snippet that imports anything imports every module it uses (torch, dist, hvd, gravac).
A snippet without imports is a fragment of the reader's own script. Running them under
the launchers is the parallel and example suites' job; this test imports, never trains.

A block that cannot compile on purpose is marked ``<!-- snippet: partial -->`` on the
line before it; it is then only searched for names."""
import ast
import importlib
import re
import textwrap
import types
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PAGES = ["README.md", *sorted(str(p.relative_to(REPO)) for p in (REPO / "docs").glob("*.md"))]
#: The public entry points whose docstrings show examples.
MODULES = ["gravac/__init__.py", "gravac/controllers/__init__.py", "gravac/engine/optimizer.py",
           *sorted(str(p.relative_to(REPO)) for d in ("gravac/hvd", "gravac/torch")
                   for p in (REPO / d).glob("*.py"))]
PARTIAL = "<!-- snippet: partial -->"
#: Names a snippet uses as modules, and how snippets import them.
MODULE_NAMES = {"torch", "dist", "hvd", "gravac"}


def page_blocks(page: str) -> list[tuple[str, str, bool]]:
    """(where, code, partial) of each ```python block of a Markdown page."""
    lines = (REPO / page).read_text().splitlines()
    found, i = [], 0
    while i < len(lines):
        if lines[i].strip() == "```python":
            start = i
            j = i + 1
            while not lines[j].strip().startswith("```"):
                j += 1
            partial = start > 0 and lines[start - 1].strip() == PARTIAL
            found.append((f"{page}:{start + 1}", "\n".join(lines[start + 1:j]) + "\n", partial))
            i = j
        i += 1
    return found


def docstring_blocks(path: str) -> list[tuple[str, str, bool]]:
    """(where, code, False) of each ``::`` block of a module's docstrings."""
    tree = ast.parse((REPO / path).read_text())
    found = []
    for node in [tree, *ast.walk(tree)]:
        if not isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef,
                                 ast.ClassDef)):
            continue
        doc = ast.get_docstring(node, clean=False)
        if not doc:
            continue
        name = getattr(node, "name", "module")
        lines = doc.splitlines()
        # The first line's indentation is the docstring's: that of its closing line.
        first = len(lines[-1]) if not lines[-1].strip() else 0
        for i, line in enumerate(lines):
            if not line.rstrip().endswith("::"):
                continue
            indent = first if i == 0 else len(line) - len(line.lstrip())
            block = []
            for nxt in lines[i + 1:]:
                if nxt.strip() and len(nxt) - len(nxt.lstrip()) <= indent:
                    break
                block.append(nxt)
            code = textwrap.dedent("\n".join(block)).strip()
            if code:
                found.append((f"{path} {name}:{i + 1}", code + "\n", False))
    return list(dict.fromkeys(found))


BLOCKS = [b for page in PAGES for b in page_blocks(page)] + \
    [b for path in MODULES for b in docstring_blocks(path)]


def _dotted(node: ast.AST) -> str | None:
    """'a.b.c' of a Name/Attribute chain, None when the chain starts at a call or such."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    parts.append(node.id)
    return ".".join(reversed(parts))


def gravac_names(tree: ast.Module) -> set[str]:
    """Every gravac name the snippet uses, written from the package: 'gravac.x.y'."""
    aliases = {}                  # a local name -> the gravac dotted name it stands for
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] == "gravac":
                    names.add(a.name)
                    aliases[a.asname] = a.name if a.asname else None
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "gravac":
            for a in node.names:
                names.add(f"{node.module}.{a.name}")
                aliases[a.asname or a.name] = f"{node.module}.{a.name}"
    aliases.pop(None, None)
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute) or isinstance(parents.get(node), ast.Attribute):
            continue                                       # only the longest chains
        dotted = _dotted(node)
        if dotted is None:
            continue
        root, _, rest = dotted.partition(".")
        if root == "gravac":
            names.add(dotted)
        elif root in aliases:
            names.add(f"{aliases[root]}.{rest}")
    return names


def resolve(dotted: str):
    """The object a dotted gravac name names: attributes, importing submodules on the way."""
    parts = dotted.split(".")
    obj = importlib.import_module(parts[0])
    for i, part in enumerate(parts[1:], start=1):
        if hasattr(obj, part):
            obj = getattr(obj, part)
            continue
        if not isinstance(obj, types.ModuleType):
            raise AttributeError(f"{'.'.join(parts[:i])} has no attribute {part!r}")
        try:
            obj = importlib.import_module(".".join(parts[:i + 1]))
        except ModuleNotFoundError as exc:
            if exc.name != ".".join(parts[:i + 1]):
                raise                              # a module it needs is missing
            raise AttributeError(f"{'.'.join(parts[:i])} has no attribute {part!r}") from None
    return obj


def test_the_snippets_were_found():
    where = [w for w, _, _ in BLOCKS]
    assert sum(w.startswith("README.md:") for w in where) >= 2, where
    assert sum(w.startswith("docs/USAGE.md:") for w in where) >= 4, where
    assert any(w.startswith("gravac/hvd/optimizer.py") for w in where), where


@pytest.mark.parametrize("where, code, partial", BLOCKS, ids=[b[0] for b in BLOCKS])
def test_snippet_compiles(where, code, partial):
    if partial:
        pytest.skip("marked partial")
    compile(code, where, "exec")


@pytest.mark.parametrize("where, code, partial", BLOCKS, ids=[b[0] for b in BLOCKS])
def test_snippet_names_exist(where, code, partial):
    if partial:
        names = {m for m in re.findall(r"(?<![\w.])gravac(?:\.\w+)+", code)}
    else:
        names = gravac_names(ast.parse(code))
    missing = []
    for name in sorted(names):
        try:
            resolve(name)
        except ModuleNotFoundError as exc:
            if exc.name and exc.name.split(".")[0] == "horovod":
                pytest.skip(f"{name} needs Horovod, which is not installed")
            missing.append(f"{name} ({exc})")
        except (AttributeError, ImportError) as exc:
            missing.append(f"{name} ({exc})")
    assert not missing, f"{where} uses names that do not exist: {missing}"


@pytest.mark.parametrize("where, code, partial", [b for b in BLOCKS if not b[2]],
                         ids=[b[0] for b in BLOCKS if not b[2]])
def test_a_snippet_that_imports_imports_what_it_uses(where, code, partial):
    tree = ast.parse(code)
    imports = [n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))]
    if not imports:
        return                                 # a fragment of the reader's script
    bound = set()
    for node in imports:
        for a in node.names:
            bound.add(a.asname or (a.name.split(".")[0] if isinstance(node, ast.Import)
                                   else a.name))
    assigned = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)
                and isinstance(n.ctx, ast.Store)}
    used = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)
            and isinstance(n.ctx, ast.Load)} & MODULE_NAMES
    unbound = sorted(used - bound - assigned)
    assert not unbound, f"{where} imports some modules but uses {unbound} without importing"
