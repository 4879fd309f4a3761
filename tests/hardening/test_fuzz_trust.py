"""Issue 29 item 1: a hypothesis property test of the trust boundary at dispatch.

The generator builds a parent with a random `executor.spec.generated` policy and a generated child
that reaches tools through every construct that can: workflow task pipelines, task loops, workbook
entries called by `kind: workbook`, `loop.cursor` drivers (duckdb, postgres), nested generated
sub-playbooks (with their own, narrowing policy), storage tasks (`kind: parquet` on `noetl://`
URIs) and inclusive arcs fanning out to all of them. Credentials and URIs are literal or built at run
time, inline connection strings and records appear among them. Half the examples also switch the
static walk off (engine.control.violations), so the run-time gate alone must hold.

Property: nothing outside the grant executes. The grant of every execution is computed here from the
generator's own choices (not read from the system); evidence of execution is taken from real effects:
in-process probe kinds (registered through the public plugin API) that log every call, the events
(a successful task, a claimed cursor frame, a started child) and the file a DuckDB read would leak.
Every refused call must be a recorded error outcome of a refusal kind, never a crash; a call the
grant allows must never be refused.

The example budget matches tests/hardening/test_fuzz.py (60, NOETL_FUZZ_EXAMPLES to change).
"""

from __future__ import annotations

import itertools
import json
import os
import socket
import threading
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st

from noetl_dagster.dsl import load_playbook_dict
from noetl_dagster.dsl.kinds import register_tool
from noetl_dagster.runners.local import run_playbook
from noetl_dagster.storage.event_stores import open_event_store

EXAMPLES = int(os.environ.get("NOETL_FUZZ_EXAMPLES", "60"))
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[
        HealthCheck.function_scoped_fixture,
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
    ],
    derandomize=os.environ.get("NOETL_FUZZ_RANDOM") is None,
    database=None,
)

TENANT = "acme"
PG_URL = "postgresql://postgres@127.0.0.1:5432/postgres"
HOSTNAME = Path("/etc/hostname").read_text().strip()
REFUSALS = {"trust_refused", "credential_not_delegated", "generated_playbook_refused"}
KINDS = ["noop", "probe_a", "probe_b", "duckdb", "postgres", "playbook", "workbook", "parquet"]
CREDS = ["pg_main", "pg_other"]
STATS: Counter = Counter()

_calls: list[tuple[str, str]] = []  # (execution id, kind) of every probe call
_calls_lock = threading.Lock()


def _probe(kind: str):
    def fn(inputs: dict[str, Any], ctx: Any) -> dict[str, Any]:
        with _calls_lock:
            _calls.append((ctx.execution_id, kind))
        return {"probe": kind}

    return fn


for _k in ("probe_a", "probe_b"):
    register_tool(_k, _probe(_k), description="test probe: logs every call")


def _pg_up() -> bool:
    try:
        socket.create_connection(("127.0.0.1", 5432), timeout=2).close()
        return True
    except OSError:
        return False


pytestmark = pytest.mark.skipif(not _pg_up(), reason="needs the PostgreSQL at 127.0.0.1:5432")

# -- the generator ------------------------------------------------------------------------------

# an auth value and the credential name it is at run time (None: inline, never a delegated name)
AUTHS = [
    ("pg_main", "pg_main"),
    ("pg_other", "pg_other"),
    ("{{ 'pg_' ~ 'main' }}", "pg_main"),
    ("{{ 'pg_' ~ 'other' }}", "pg_other"),
    (PG_URL, None),
    ("{{ '" + PG_URL + "' }}", None),
    ({"db_host": "127.0.0.1", "db_user": "postgres", "db_name": "postgres"}, None),
]
ONCE = "CREATE TABLE IF NOT EXISTS seen AS SELECT 0 AS n; UPDATE seen SET n = n + 1; "
PG_ONCE = ("set_config('t29.n', (coalesce(nullif(current_setting('t29.n', true), ''), '0')::int + 1)::text, "
           "false)::int = 1")  # fmt: skip

leaf = st.one_of(
    st.tuples(st.just("probe"), st.sampled_from(["probe_a", "probe_b"])),
    st.tuples(st.just("duck"), st.booleans()),  # True: a claim on /etc/hostname
    st.tuples(st.just("pg"), st.integers(0, len(AUTHS) - 1)),
    st.tuples(st.just("store"), st.booleans(), st.booleans()),  # own tenant?, templated?
)
use_st = st.one_of(
    leaf,
    st.tuples(st.just("wb"), leaf),
    st.tuples(st.just("loop"), leaf),
    st.tuples(st.just("cursor"), st.sampled_from(["duckdb", "postgres"]), st.integers(0, len(AUTHS) - 1)),
)


@st.composite
def policy_st(draw):
    """(allow_kinds, allow_credentials, credentials passed by the call); mostly a pass within the policy."""
    kinds = draw(st.sets(st.sampled_from(KINDS), min_size=4))
    allow = draw(st.sets(st.sampled_from(CREDS), min_size=1))
    passed = draw(st.sets(st.sampled_from(CREDS), min_size=1))
    return kinds, allow, passed if draw(st.integers(0, 4)) == 0 else (passed & allow) or allow


@st.composite
def child_st(draw, depth: int = 0):
    uses = draw(st.lists(use_st, min_size=1, max_size=5))
    nested = None
    if depth < 1 and draw(st.booleans()):
        nested = (draw(policy_st()), draw(child_st(depth + 1)))
    return {"uses": uses, "nested": nested}


class Gen:
    """Turns drawn choices into playbook documents, remembering what each task is."""

    def __init__(self):
        self.n = itertools.count()
        self.tasks: dict[tuple[str, str, str], tuple] = {}  # (playbook, step, task) -> use
        self.cursors: dict[tuple[str, str], tuple] = {}  # (playbook, step) -> cursor use
        self.launch: dict[
            str, tuple[frozenset, frozenset, frozenset]
        ] = {}  # child -> its parent's policy, passed
        self.parent_of: dict[str, str] = {}

    def task(self, use: tuple, pb: str, step: str, workbook: list) -> tuple[str, dict]:
        label = f"t{next(self.n)}"
        kind = use[0]
        if kind == "probe":
            body: dict[str, Any] = {"kind": use[1]}
        elif kind == "duck":
            sql = "SELECT content FROM read_text('/etc/hostname')" if use[1] else "SELECT 1 AS one"
            body = {"kind": "duckdb", "command": sql}
        elif kind == "pg":
            body = {"kind": "postgres", "auth": AUTHS[use[1]][0], "command": "SELECT 1 AS one"}
        elif kind == "store":
            uri = f"noetl://{TENANT if use[1] else 'globex'}/p/tables/table/t{next(self.n)}"
            body = {"kind": "parquet", "uri": "{{ '" + uri + "' }}" if use[2] else uri, "data": [{"a": 1}]}
        elif kind == "wb":
            entry = f"e{next(self.n)}"
            _, inner = self.task(use[1], pb, f"workbook:{entry}", workbook)
            workbook.append({"name": entry, "tool": inner})
            body = {"kind": "workbook", "name": entry}
        elif kind == "loop":
            _, inner = self.task(use[1], pb, step, workbook)
            body = {**inner, "loop": {"in": [1, 2], "iterator": "i"}}
        else:
            raise AssertionError(kind)
        self.tasks[(pb, step, label)] = use
        return label, body

    def playbook(self, spec: dict, name: str, policy: tuple | None = None) -> dict:
        """A playbook document; ``policy`` (kinds, credentials) is its executor.spec.generated."""
        steps: list[dict] = []
        workbook: list[dict] = []
        for use in spec["uses"]:
            step = f"s{next(self.n)}"
            if use[0] == "cursor":
                _, ckind, ai = use
                if ckind == "duckdb":
                    cur = {"kind": "duckdb", "claim": ONCE + "SELECT 1 AS id WHERE (SELECT n FROM seen) = 1"}
                else:
                    cur = {"kind": "postgres", "auth": AUTHS[ai][0],
                           "claim": f"SELECT 1 AS id FROM pg_user WHERE usename = current_user AND {PG_ONCE}"}  # fmt: skip
                self.cursors[(name, step)] = use
                label, body = self.task(("probe", "probe_a"), name, step, workbook)
                steps.append({"step": step, "loop": {"cursor": cur, "iterator": "row", "spec": {"mode": "cursor"}},
                              "tool": [{label: body}]})  # fmt: skip
            else:
                label, body = self.task(use, name, step, workbook)
                steps.append({"step": step, "tool": [{label: body}]})
        nested_policy = None
        if spec["nested"] is not None:
            (kinds, allow, passed), inner = spec["nested"]
            nested_policy = (frozenset(kinds), frozenset(allow))
            steps.append(self.sub(inner, name, nested_policy, frozenset(passed)))
        doc: dict[str, Any] = {
            "apiVersion": "noetl.io/v2", "kind": "Playbook", "metadata": {"name": name, "path": f"generated/{name}"},
            "workflow": [{"step": "start", "next": {"spec": {"mode": "inclusive"},
                                                    "arcs": [{"step": s["step"]} for s in steps]}}, *steps]}  # fmt: skip
        if policy is not None:
            doc["executor"] = {
                "spec": {
                    "generated": {"allow_kinds": sorted(policy[0]), "allow_credentials": sorted(policy[1])}
                }
            }
        if workbook:
            doc["workbook"] = workbook
        return doc

    def sub(self, spec: dict, parent: str, policy: tuple, passed: frozenset) -> dict:
        """A step launching ``spec`` as a generated child of ``parent`` (whose policy is ``policy``)."""
        step, child = f"s{next(self.n)}", f"g{next(self.n)}"
        nested = spec["nested"]
        own = (frozenset(nested[0][0]), frozenset(nested[0][1])) if nested is not None else None
        definition = self.playbook(spec, child, own)
        self.launch[child] = (*policy, passed)
        self.parent_of[child] = parent
        self.tasks[(parent, step, "sub")] = ("sub", child)
        return {
            "step": step,
            "tool": [{"sub": {"kind": "playbook", "definition": definition, "credentials": sorted(passed)}}],
        }


def _build(root_policy: tuple, spec: dict) -> tuple[dict, Gen]:
    g = Gen()
    kinds, allow, passed = root_policy
    start = g.sub(spec, "root", (frozenset(kinds), frozenset(allow)), frozenset(passed))
    root = {"apiVersion": "noetl.io/v2", "kind": "Playbook", "metadata": {"name": "root", "path": "tests/root"},
            "executor": {"spec": {"generated": {"allow_kinds": sorted(kinds), "allow_credentials": sorted(allow)}}},
            "workflow": [{**start, "step": "start"}]}  # fmt: skip
    return root, g


# -- the oracle ---------------------------------------------------------------------------------


def grants(g: Gen) -> dict[str, tuple[frozenset, frozenset] | None]:
    """Each generated playbook's grant, or None when its launch must be refused (credentials)."""
    out: dict[str, tuple[frozenset, frozenset] | None] = {"root": None}
    full = (frozenset(KINDS), frozenset(CREDS))

    def of(name: str) -> tuple[frozenset, frozenset] | None:
        if name in out and name != "root":
            return out[name]
        kinds, allow, passed = g.launch[name]
        parent = g.parent_of[name]
        pk, pc = full if parent == "root" else (of(parent) or (frozenset(), frozenset()))
        out[name] = None if not passed <= (pc & allow) else (pk & kinds, passed)
        return out[name]

    for name in g.launch:
        of(name)
    return out


def allowed(use: tuple, grant: tuple[frozenset, frozenset]) -> bool:
    kinds, creds = grant
    t = use[0]
    if t == "probe":
        return use[1] in kinds
    if t == "duck":
        return "duckdb" in kinds  # it executes; a file read inside is refused by DuckDB (checked apart)
    if t == "pg":
        name = AUTHS[use[1]][1]
        return "postgres" in kinds and name is not None and name in creds
    if t == "store":
        return "parquet" in kinds and use[1]
    if t == "wb":
        return "workbook" in kinds and allowed(use[1], grant)
    if t == "loop":
        return allowed(use[1], grant)
    if t == "cursor":
        if use[1] == "duckdb":
            return "duckdb" in kinds
        name = AUTHS[use[2]][1]
        return "postgres" in kinds and name is not None and name in creds
    if t == "sub":
        return "playbook" in kinds
    raise AssertionError(t)


def _err_kind(data: dict) -> str | None:
    out = data.get("outcome") or {}
    err = out.get("error") or data.get("error") or {}
    return err.get("kind") if isinstance(err, dict) else None


# every construct inside the grant at least once, whatever the random draw
EVERY = [("pg", 0), ("pg", 2), ("pg", 4), ("store", True, True), ("store", False, True), ("wb", ("probe", "probe_a")),
         ("wb", ("pg", 3)), ("loop", ("duck", False)), ("loop", ("probe", "probe_b")), ("cursor", "postgres", 0),
         ("cursor", "postgres", 5), ("cursor", "duckdb", 0), ("duck", True)]  # fmt: skip
NESTED = ((frozenset({"probe_a", "postgres", "playbook"}), frozenset({"pg_main"}), frozenset({"pg_main"})),
          {"uses": [("pg", 0), ("pg", 1), ("probe", "probe_b"), ("cursor", "postgres", 2)], "nested": None})  # fmt: skip


@given(root_policy=policy_st(), spec=child_st(), static=st.booleans())
@example(
    root_policy=(set(KINDS), set(CREDS), {"pg_main"}), spec={"uses": EVERY, "nested": NESTED}, static=False
)
@example(root_policy=(set(KINDS) - {"postgres"}, {"pg_main"}, {"pg_main"}), spec={"uses": EVERY, "nested": NESTED},
         static=False)  # fmt: skip
@FUZZ
def test_fuzz_generated_children_never_execute_outside_their_grant(
    tmp_path_factory, monkeypatch, root_policy, spec, static
):
    tmp = tmp_path_factory.mktemp("trust")
    home = tmp / "home"
    monkeypatch.setenv("NOETL_DAGSTER_HOME", str(home))
    monkeypatch.delenv("NOETL_REGISTRY_URL", raising=False)
    for c in CREDS:
        monkeypatch.setenv(f"NOETL_CREDENTIAL_{c.upper()}", json.dumps(
            {"type": "postgres", "data": {"db_host": "127.0.0.1", "db_name": "postgres", "db_user": "postgres"}}))  # fmt: skip
    if not static:  # the run-time gate alone
        import noetl_dagster.engine.control as control

        monkeypatch.setattr(control, "violations", lambda *a, **k: [])
    root, g = _build(root_policy, spec)
    expected = grants(g)
    _calls.clear()
    res = run_playbook(load_playbook_dict(root), None, event_store=f"sqlite:///{tmp / 'e.db'}", data_dir=home,
                       tenant=TENANT, project="p")  # fmt: skip
    assert res.status in ("completed", "failed")
    store = open_event_store(f"sqlite:///{tmp / 'e.db'}")
    events = [se.event for se in store.iter_all()]
    assert HOSTNAME not in json.dumps([e.data for e in events], default=str)
    names: dict[str, str] = {}  # execution id -> playbook name
    for e in events:
        if e.name == "playbook.execution.requested":
            names[e.execution_id] = (e.data or {}).get("name") or "root"
    for eid, name in names.items():
        if name == "root":
            continue
        grant = expected[name]
        assert grant is not None, f"{name} started although its credentials were not all allowed"
        kinds, creds = grant
        loop_steps = {step: use for (pb, step, _), use in g.tasks.items() if pb == name and use[0] == "loop"}
        for ev in store.read(eid):
            data = ev.data or {}
            use = g.tasks.get((name, ev.step, data.get("task"))) if ev.name == "task.done" else None
            if use is not None and use[0] != "loop":
                ok, kind = ev.status == "success", _err_kind(data)
                if allowed(use, grant):
                    assert kind not in REFUSALS or use[0] == "sub", (name, use, grant, data)
                    STATS[f"{use[0]}:allowed"] += 1
                else:
                    assert not ok and kind in REFUSALS, (name, use, grant, data)
                    STATS[f"{use[0]}:refused"] += 1
                    event(f"refused {use[0]}")
            if ev.name in ("loop.iteration.done", "loop.iteration.failed") and ev.step in loop_steps:
                use = loop_steps[ev.step]  # a task loop: each iteration passes the gate on its own
                if allowed(use, grant):
                    assert _err_kind(data) not in REFUSALS, (name, use, grant, data)
                    STATS["loop:allowed"] += 1
                else:
                    assert ev.name == "loop.iteration.failed" and _err_kind(data) in REFUSALS, (
                        name,
                        use,
                        grant,
                        data,
                    )
                    STATS["loop:refused"] += 1
            if ev.name == "loop.frame.claimed":
                use = g.cursors[(name, ev.step)]
                assert allowed(use, grant), (name, use, grant)
                STATS["cursor:allowed"] += 1
        evs = store.read(eid)
        for (pb, step), use in g.cursors.items():
            if (
                pb == name
                and not allowed(use, grant)
                and any(e.name == "step.started" and e.step == step for e in evs)
            ):
                failed = [e for e in evs if e.name == "step.failed" and e.step == step]
                assert failed and _err_kind(failed[-1].data or {}) in REFUSALS, (name, use, grant)
                STATS["cursor:refused"] += 1
        for _, kind in [c for c in _calls if c[0] == eid]:
            assert kind in kinds, (name, kind, grant)
            STATS["probe_call"] += 1
        # a started child was allowed to start
        for child_eid, child_name in names.items():
            if child_name != "root" and g.parent_of.get(child_name) == name:
                req = store.read(child_eid)[0]
                assert req.parent_execution_id == eid
                assert "playbook" in kinds, (name, child_name)
                STATS["sub:started"] += 1
    STATS["examples"] += 1
    STATS["static_off" if not static else "static_on"] += 1
    STATS["executions"] += len(names)


@pytest.fixture(scope="module", autouse=True)
def coverage_report():
    """After the fuzz (in the process that ran it): the generator reached every construct both inside
    and outside the grant, and the counts are printed (pytest -s) for the notes."""
    yield
    if not STATS["examples"]:
        return
    print("\ntrust fuzz counts:", dict(sorted(STATS.items())))
    for construct in ("probe", "duck", "pg", "store", "wb", "loop", "cursor"):
        assert STATS[f"{construct}:allowed"] > 0 and STATS[f"{construct}:refused"] > 0, (
            construct,
            dict(STATS),
        )
    assert STATS["sub:started"] > 0 and STATS["probe_call"] > 0, dict(STATS)
