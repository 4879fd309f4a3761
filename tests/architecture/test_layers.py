"""The layout shows the design (docs/architecture.md): layers, no import cycles,
modules and classes of a readable size. These checks fail the build when a change
breaks the contract, so the picture in the docs stays true."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import grimp
import pytest

ROOT = Path(__file__).resolve().parents[2]
# import package -> the folder that holds it (one distribution, noetl-specific names: docs/architecture.md)
FOLDERS = {
    "noetl_dagster": ROOT / "noetl_dagster",
    "noetl_registry": ROOT / "registry_service" / "noetl_registry",
    "noetl_lineage": ROOT / "lineage" / "noetl_lineage",
    "noetl_analytics": ROOT / "analytics" / "noetl_analytics",
}
PACKAGES = tuple(FOLDERS)
MAX_MODULE_LINES = 800
MAX_CLASS_LINES = 400


def test_import_contracts_hold():
    """import-linter's layers and forbidden-import contracts (pyproject.toml)."""
    lint = Path(sys.executable).with_name("lint-imports")
    proc = subprocess.run([str(lint), str(ROOT / "pyproject.toml")], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]


def _cycles(graph: grimp.ImportGraph) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    counter = 0
    for root in sorted(graph.modules):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.find_modules_directly_imported_by(root))))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            advanced = False
            for child in children:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.find_modules_directly_imported_by(child)))))
                    advanced = True
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                comp = []
                while True:
                    m = stack.pop()
                    on_stack.discard(m)
                    comp.append(m)
                    if m == node:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


@pytest.fixture(scope="module")
def graph() -> grimp.ImportGraph:
    # imports under `if TYPE_CHECKING:` are annotations, not dependencies at run time
    return grimp.build_graph(*PACKAGES, exclude_type_checking_imports=True)


def test_no_module_import_cycles(graph):
    """No two modules import each other, directly or around a circle (a submodule
    importing its own package's __init__ counts: that is how cycles hide)."""
    assert _cycles(graph) == []


def test_the_engine_has_no_import_circle_even_through_annotations():
    """The engine (noetl_dagster.engine) imports no module that imports it back, counting imports
    under `if TYPE_CHECKING:` too (issue 46: control, durability, worker and loops imported each
    other around one; they type against engine/execution.py's ExecutionEngine Protocol now)."""
    # no cache: its entries are keyed by file mtimes, which a rebase or a checkout can leave stale
    full = grimp.build_graph("noetl_dagster", exclude_type_checking_imports=False, cache_dir=None)
    assert [c for c in _cycles(full) if any(m.startswith("noetl_dagster.engine.") for m in c)] == []


def test_no_package_import_cycles(graph):
    """Folders (noetl_dagster.<part> and the top-level packages) form no circle."""

    def part(m: str) -> str:
        bits = m.split(".")
        return ".".join(bits[:2]) if bits[0] == "noetl_dagster" else bits[0]

    squashed = grimp.ImportGraph()
    for m in graph.modules:
        squashed.add_module(part(m))
    for m in graph.modules:
        for imported in graph.find_modules_directly_imported_by(m):
            if part(imported) != part(m):
                squashed.add_import(importer=part(m), imported=part(imported))
    assert _cycles(squashed) == []


def _sources():
    for pkg in PACKAGES:
        yield from sorted(FOLDERS[pkg].rglob("*.py"))


def test_modules_and_classes_stay_readable():
    """No module over 800 lines, no class over 400: split by responsibility."""
    too_long = []
    for path in _sources():
        text = path.read_text()
        rel = path.relative_to(ROOT)
        if text.count("\n") > MAX_MODULE_LINES:
            too_long.append(f"{rel}: {text.count(chr(10))} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ClassDef) and node.end_lineno - node.lineno + 1 > MAX_CLASS_LINES:
                too_long.append(
                    f"{rel}:{node.lineno}: class {node.name}: {node.end_lineno - node.lineno + 1} lines"
                )
    assert too_long == []


def test_no_loose_modules_at_the_top():
    """Every concept lives in a folder named after it."""
    loose = sorted(p.name for p in (ROOT / "noetl_dagster").glob("*.py") if p.name != "__init__.py")
    assert loose == []


def test_the_checks_catch_a_cycle_and_an_upward_import(tmp_path, monkeypatch):
    """The cycle finder and the layer contract are not vacuous."""
    g = grimp.ImportGraph()
    for m in ("p.a", "p.b", "p.c"):
        g.add_module(m)
    g.add_import(importer="p.a", imported="p.b")
    g.add_import(importer="p.b", imported="p.c")
    g.add_import(importer="p.c", imported="p.a")
    assert _cycles(g) == [["p.a", "p.b", "p.c"]]

    pkg = tmp_path / "toy"
    (pkg / "low").mkdir(parents=True)
    (pkg / "high").mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "low" / "__init__.py").write_text("import toy.high\n")
    (pkg / "high" / "__init__.py").write_text("")
    (tmp_path / "pyproject.toml").write_text(
        '[tool.importlinter]\nroot_package = "toy"\n[[tool.importlinter.contracts]]\nname = "l"\n'
        'type = "layers"\nlayers = ["toy.high", "toy.low"]\n'
    )
    lint = Path(sys.executable).with_name("lint-imports")
    proc = subprocess.run(
        [str(lint)], cwd=tmp_path, capture_output=True, text=True, env={"PYTHONPATH": str(tmp_path)}
    )
    assert proc.returncode == 1 and "toy.low is not allowed to import toy.high" in proc.stdout
