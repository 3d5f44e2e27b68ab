"""No import cycles among the modules of uqmetrics, uqreg and uqvision (issue 39).

Every module of a package is read with :mod:`ast` (nothing is imported): its source files are
found where the package is installed (``importlib.util.find_spec(NAME).
submodule_search_locations``; in tox's integration environment the three are editable
installs of this tree). The rule:

- every ``import`` and ``from ... import`` counts, wherever it is: at the top of the module,
  inside a function (a lazy import is still an edge), under ``if TYPE_CHECKING:``;
- a relative import is resolved against the module's package (``from .x import y`` in
  ``pkg/a.py`` is ``pkg.x``; in ``pkg/__init__.py`` it is ``pkg.x`` too), and ``from pkg import
  name`` is an edge to ``pkg.name`` when that is a module of the package (a submodule), else
  to ``pkg``; an imported name is taken to its longest prefix that is a module of the package;
- an import of one of the module's own enclosing packages (its package face: ``pkg.a``
  importing ``pkg``) is not an edge: a package's ``__init__`` re-exports its submodules, and
  those import names from the package face, which is not a cycle.

The cycles are the strongly connected components of more than one module of that graph; the
test names each as ``a <-> b <-> c``. Before issue 39 it found seven: six in uqvision and
``uqmetrics.io <-> uqmetrics.result_schema <-> uqmetrics.run_config``.
"""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

import pytest

PACKAGES = ("uqmetrics", "uqreg", "uqvision")


def modules_of(root: Path, package: str) -> dict[str, tuple[Path, bool]]:
    """``{dotted name: (source file, is a package __init__)}`` of every ``.py`` file under
    ``root`` (the folder of ``package``)."""
    found = {}
    for path in sorted(root.rglob("*.py")):
        parts = [package, *path.relative_to(root).with_suffix("").parts]
        is_init = parts[-1] == "__init__"
        found[".".join(parts[:-1] if is_init else parts)] = (path, is_init)
    return found


def imported_names(name: str, is_init: bool, tree: ast.AST) -> list[str]:
    """The dotted names every import of a module's tree names (relative ones resolved; for
    ``from X import a, b``: ``X.a`` and ``X.b``, each taken to its module later)."""
    package = name if is_init else name.rpartition(".")[0]
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[:len(parts) - node.level + 1])
                source = ".".join(part for part in (base, node.module) if part)
            else:
                source = node.module or ""
            out += [source] + [f"{source}.{alias.name}" for alias in node.names]
    return out


def import_graph(root: Path, package: str) -> dict[str, set[str]]:
    """Module -> the modules of the package it imports (the rule of the module docstring)."""
    modules = modules_of(root, package)
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for name, (path, is_init) in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for target in imported_names(name, is_init, tree):
            while target and target not in modules:  # its longest prefix that is a module
                target = target.rpartition(".")[0]
            if target and target != name and not name.startswith(target + "."):
                graph[name].add(target)
    return graph


def _reachable(graph: dict[str, set[str]], start: str) -> set[str]:
    seen, todo = {start}, [start]
    while todo:
        for nxt in graph[todo.pop()]:
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return seen


def import_cycles(root: Path, package: str) -> list[str]:
    """Each import cycle of ``package`` (its source folder ``root``) as ``"a <-> b <-> c"``
    (its modules sorted): the strongly connected components of more than one module, each the
    modules a module reaches that also reach it back."""
    graph = import_graph(root, package)
    reach = {m: _reachable(graph, m) for m in graph}
    components = {frozenset(n for n in reach[m] if m in reach[n]) for m in graph}
    return sorted(" <-> ".join(sorted(c)) for c in components if len(c) > 1)


def package_folder(package: str) -> Path:
    """Where ``package``'s modules are (its installed location; the editable install of this
    tree in the integration environment)."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        pytest.fail(f"package {package!r} is not installed in this environment")
    return Path(next(iter(spec.submodule_search_locations)))


@pytest.mark.parametrize("package", PACKAGES)
def test_no_import_cycles(package):
    cycles = import_cycles(package_folder(package), package)
    assert not cycles, f"{len(cycles)} import cycle(s) in {package}: " + "; ".join(cycles)


# --------------------------------------------------------------------------------------------
# the detector itself, on a package written here


def _write(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        path = root / "toy" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return root / "toy"


def test_a_cycle_through_an_import_inside_a_function_is_found(tmp_path):
    root = _write(tmp_path, {
        "__init__.py": "",
        "a.py": "from .b import B\n",
        "b.py": "B = 1\n\ndef f():\n    from toy import c  # lazy: still an edge\n    return c\n",
        "c.py": "from . import a\n",
        "d.py": "import toy.a\n",  # imports the cycle, is not in it
    })
    assert import_cycles(root, "toy") == ["toy.a <-> toy.b <-> toy.c"]


def test_a_package_face_re_exporting_its_submodules_is_not_a_cycle(tmp_path):
    root = _write(tmp_path, {
        "__init__.py": "from .a import A\nfrom .sub import S\nVERSION = 1\n",
        "a.py": "from toy import VERSION\nA = VERSION\n",
        "sub/__init__.py": "from . import inner\nfrom .inner import S\n",
        "sub/inner.py": "from .. import VERSION\nfrom toy.sub import helper\nS = VERSION\n",
        "sub/helper.py": "",
    })
    assert import_graph(root, "toy")["toy.sub.inner"] == {"toy.sub.helper"}
    assert import_cycles(root, "toy") == []


def test_type_checking_imports_and_from_package_import_submodule_count(tmp_path):
    root = _write(tmp_path, {
        "__init__.py": "",
        "x.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .y import Y\n",
        "y.py": "from toy import x\nY = 1\n",
    })
    assert import_graph(root, "toy")["toy.y"] == {"toy.x"}
    assert import_cycles(root, "toy") == ["toy.x <-> toy.y"]
