"""The execution page's graph layout (networkx's multipartite layout over the layers of the
condensation) and when a server imports it: at its start, not at a page's first open."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from noetl_analytics.execution_view import ExecutionViews, layout
from noetl_dagster.storage.event_stores import open_event_store

REPO = Path(__file__).resolve().parents[2]


def _reaches(edges: list[tuple[str, str]], a: str, b: str) -> bool:
    seen, todo = {a}, [a]
    while todo:
        n = todo.pop()
        for x, y in edges:
            if x == n and y not in seen:
                seen.add(y)
                todo.append(y)
    return b in seen


def _check_layers(steps: list[str], edges: list[tuple[str, str]], pos: dict[str, list[float]]) -> None:
    """Every arc goes from a lower layer (x) to a higher one, except an arc inside a cycle (its
    head reaches its tail); a cycle's steps sit in adjacent layers, side by side."""
    assert set(pos) == set(steps)
    assert all(-1.0 <= c <= 1.0 for p in pos.values() for c in p)
    xs = sorted({p[0] for p in pos.values()})
    col = {n: xs.index(p[0]) for n, p in pos.items()}
    for a, b in edges:
        if _reaches(edges, b, a):  # in a cycle (or a self-arc): same or neighbouring layer
            assert abs(col[a] - col[b]) <= 1, (a, b, col)
        else:
            assert col[a] < col[b], (a, b, col)
    for n in steps:  # no two steps on one point
        assert sum(pos[m] == pos[n] for m in steps) == 1


def test_layers_follow_the_arcs_cycles_side_by_side_joins_after_their_inputs():
    steps = ["start", "a", "b", "c", "loop1", "loop2", "loop3", "join", "end", "self"]
    edges = [("start", "a"), ("start", "b"), ("a", "c"), ("b", "join"), ("c", "join"),  # join after both
             ("join", "loop1"), ("loop1", "loop2"), ("loop2", "loop3"), ("loop3", "loop1"),  # a 3-cycle
             ("loop2", "end"), ("end", "self"), ("self", "self")]  # fmt: skip
    pos = layout({"steps": steps, "edges": [{"from": a, "to": b} for a, b in edges]})
    _check_layers(steps, edges, pos)
    xs = sorted({p[0] for p in pos.values()})
    assert xs.index(pos["join"][0]) > xs.index(pos["c"][0]) > xs.index(pos["a"][0])
    assert len({pos[n][0] for n in ("loop1", "loop2", "loop3")}) == 2  # side by side, not one column
    assert layout({"steps": [], "edges": []}) == {}


def test_the_page_graph_of_a_real_cyclic_execution(run, home):
    eid = run("explain_demo.yaml", {"route": "right"})
    g = ExecutionViews(open_event_store(None, data_dir=home)).explain(eid)["graph"]
    edges = [(e["from"], e["to"]) for e in g["edges"]]
    assert ("spin", "spin") in edges
    _check_layers(g["steps"], edges, g["positions"])


SERVER = textwrap.dedent(
    """
    import json, sys
    from pathlib import Path
    from noetl_analytics.dashboard_access import KeyAuth
    from noetl_analytics.execution_view import ExecutionViews
    from noetl_analytics.interactive import make_server
    from noetl_analytics.store import FactsStore
    from noetl_dagster.storage.event_stores import open_event_store
    from noetl_registry.service import Registry

    d = Path(sys.argv[1])
    before = {m for m in ("networkx",) if m in sys.modules}  # numpy may come with chdb
    views = ExecutionViews(open_event_store(None, data_dir=d), data_dir=str(d))
    server = make_server(FactsStore(f"chdb://{d / 'facts'}"), port=0, auth=KeyAuth(Registry(f"sqlite:///{d / 'r.db'}")),
                         executions=views)
    print(json.dumps({"before": sorted(before), "started": sorted(m for m in ("networkx", "numpy") if m in sys.modules)}))
    server.server_close()
    """
)


def test_a_server_imports_the_layout_library_before_it_listens(tmp_path):
    """Structural: in a fresh interpreter, make_server with execution pages has networkx and
    numpy imported, so a page's first open does not import them (bench_explain has the times)."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
    }
    out = subprocess.run([sys.executable, "-c", SERVER, str(tmp_path)], capture_output=True, text=True,
                         env=env, cwd=tmp_path, timeout=300)  # fmt: skip
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got == {"before": [], "started": ["networkx", "numpy"]}


BLOCK_NETWORKX = textwrap.dedent(
    """
    import sys

    class _Blocker:
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] == "networkx":
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)

    sys.meta_path.insert(0, _Blocker())
    from noetl_dagster.commands.main import main
    sys.argv = ["noetl-dagster", *sys.argv[1:]]
    main()
    """
)


def test_serve_without_networkx_names_the_extra_at_start(tmp_path):
    """Without networkx the server does not start (rather than failing at a page): one line."""
    env = {**os.environ, "NOETL_DAGSTER_HOME": str(tmp_path / "noetl"),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}  # fmt: skip
    argv = ["dashboard", "serve", "--no-refresh", "--port", "0", "--warm", "0",
            "--registry", f"sqlite:///{tmp_path / 'r.db'}"]  # fmt: skip
    out = subprocess.run([sys.executable, "-c", BLOCK_NETWORKX, *argv], capture_output=True, text=True,
                         env=env, cwd=tmp_path, timeout=120)  # fmt: skip
    assert out.returncode == 2, (out.stdout, out.stderr)
    assert "Traceback" not in out.stderr
    assert "needs the 'analytics' extra: pip install 'noetl-dagster[analytics]'" in out.stderr, out.stderr
    assert out.stderr.count("\n") == 1
