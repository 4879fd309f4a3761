"""Issue 29 item 1: the trust boundary of generated playbooks holds at run time, at dispatch.

Each escape of the probe is replayed against real parts (SQLite event store, real DuckDB, the real
PostgreSQL at 127.0.0.1:5432, the real CLI as a process): a `loop.cursor` whose DuckDB claim reads a
file or writes one with `COPY ... TO`, a Postgres cursor (and task) with an inline auth URL, a
generated python/shell task reading the worker's environment from `/proc/<ppid>/environ`. The static
walk (engine.trust.violations) now sees cursors too, so most cases are also tested in a shape it
cannot decide (templated values, the kind allowed, a resumed log): the gate at dispatch refuses them.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from noetl_dagster.dsl import load_playbook_dict
from noetl_dagster.engine.ports import ToolError
from noetl_dagster.runners.local import resume_execution, run_playbook
from noetl_dagster.storage.event_stores import open_event_store

SECRET = "wk-Cr3dential-never-readable"
PG = "postgresql://postgres@127.0.0.1:5432/postgres"
HOSTNAME = Path("/etc/hostname").read_text().strip()
# a claim that hands its row out once (a cursor loop ends on an empty claim)
ONCE = "CREATE TABLE IF NOT EXISTS seen AS SELECT 0 AS n; UPDATE seen SET n = n + 1; "
PG_ONCE = ("set_config('t29.n', (coalesce(nullif(current_setting('t29.n', true), ''), '0')::int + 1)::text, "
           "false)::int = 1")  # fmt: skip


def _pg_up() -> bool:
    try:
        socket.create_connection(("127.0.0.1", 5432), timeout=2).close()
        return True
    except OSError:
        return False


def child(*steps: dict, **extra) -> dict:
    return {"apiVersion": "noetl.io/v2", "kind": "Playbook", "metadata": {"name": "gen", "path": "generated/gen"},
            "workflow": [{"step": "start", "next": {"arcs": [{"step": steps[0]["step"]}]}}, *steps], **extra}  # fmt: skip


def parent(
    definition: dict, kinds: list[str], creds: list[str] | None = None, passed: list[str] | None = None
) -> dict:
    return {"apiVersion": "noetl.io/v2", "kind": "Playbook", "metadata": {"name": "parent", "path": "tests/parent"},
            "executor": {"spec": {"generated": {"allow_kinds": kinds, "allow_credentials": creds or ["pg_main"]}}},
            "workflow": [{"step": "start", "tool": [{"child": {"kind": "playbook", "definition": definition,
                                                               "credentials": passed or ["pg_main"]}}]}]}  # fmt: skip


def cursor_step(kind: str, claim: str, auth=None, options: dict | None = None) -> dict:
    cur = {
        "kind": kind,
        "claim": claim,
        **({"auth": auth} if auth is not None else {}),
        "options": options or {},
    }
    return {"step": "s", "loop": {"cursor": cur, "iterator": "row", "spec": {"mode": "cursor"}},
            "tool": [{"n": {"kind": "noop"}}]}  # fmt: skip


@pytest.fixture
def env(tmp_path, monkeypatch):
    home = tmp_path / "home"
    monkeypatch.setenv("NOETL_DAGSTER_HOME", str(home))
    # a delegated credential that is NOT a superuser's: a role without login rights is enough to tell them apart
    monkeypatch.setenv("NOETL_CREDENTIAL_PG_MAIN", json.dumps(
        {"type": "postgres", "data": {"db_host": "127.0.0.1", "db_port": 5432, "db_name": "postgres",
                                      "db_user": "postgres", "db_password": SECRET}}))  # fmt: skip
    url = f"sqlite:///{tmp_path / 'events.db'}"

    class Run:
        store_url = url
        data_dir = home

        def __call__(self, doc: dict, tenant: str = "default"):
            res = run_playbook(load_playbook_dict(doc), None, event_store=url, data_dir=home, tenant=tenant)
            store = open_event_store(url)
            events = [se.event for se in store.iter_all()]
            kids = [e.execution_id for e in events if e.name == "playbook.execution.requested"
                    and e.parent_execution_id == res.execution_id]  # fmt: skip
            return res, store, events, kids

    return Run()


def _text(events) -> str:
    return json.dumps([e.to_dict() if hasattr(e, "to_dict") else e.__dict__ for e in events], default=str)


def _error_of(store, execution_id: str, step: str = "s") -> dict:
    for e in reversed(store.read(execution_id)):
        if e.step == step and e.status == "error":
            d = e.data or {}
            err = (
                d.get("error")
                or (d.get("outcome") or {}).get("error")
                or (d.get("result") or {}).get("error")
            )
            if err:
                return err
    raise AssertionError(f"no error recorded for step {step!r}")


# -- loop.cursor: DuckDB ------------------------------------------------------------------------


def test_the_probe_shape_is_refused_for_a_cursor_the_grant_does_not_allow(env):
    """The probe: parent allows [http, noop], the child drains a DuckDB cursor reading a file."""
    claim = ONCE + "SELECT 1 AS id, content FROM read_text('/etc/hostname') WHERE (SELECT n FROM seen) = 1"
    res, store, events, kids = env(
        parent(child(cursor_step("duckdb", claim, options={"key": "content"})), ["http", "noop"])
    )
    assert res.status == "failed"
    err = res.results["start"]["error"]
    assert (
        err["kind"] == "generated_playbook_refused"
        and "cursor kind 'duckdb' is not allowed" in err["message"]
    )
    assert kids == []  # nothing of the child ran
    assert HOSTNAME not in _text(events)


def test_a_duckdb_cursor_claim_cannot_read_a_file_even_with_duckdb_allowed(env):
    claim = ONCE + "SELECT 1 AS id, content FROM read_text('/etc/hostname') WHERE (SELECT n FROM seen) = 1"
    res, store, events, kids = env(
        parent(child(cursor_step("duckdb", claim, options={"key": "content"})), ["duckdb", "noop"])
    )
    assert res.status == "failed"
    assert len(kids) == 1
    err = _error_of(store, kids[0])
    assert err["kind"] == "cursor_error" and "file system operations are disabled" in err["message"], err
    assert not [e for e in store.read(kids[0]) if e.name == "loop.frame.claimed"]
    assert HOSTNAME not in _text(events)


def test_a_duckdb_cursor_or_task_cannot_copy_to_a_file(env, tmp_path):
    out = tmp_path / "escaped.csv"
    copy = f"COPY (SELECT 42 AS x) TO '{out}'"
    for step in (cursor_step("duckdb", ONCE + copy + "; SELECT 1 AS id WHERE false"),
                 {"step": "s", "tool": [{"d": {"kind": "duckdb", "command": copy}}]}):  # fmt: skip
        res, store, events, kids = env(parent(child(step), ["duckdb", "noop"]))
        assert res.status == "failed"
        err = _error_of(store, kids[0])
        assert "file system operations are disabled" in err["message"], err
        assert not out.exists()


def test_a_generated_duckdb_keeps_its_own_files_in_its_own_directory(env):
    """What stays allowed: a database file and COPY inside the execution's own directory."""
    step = {"step": "s", "tool": [{"d": {"kind": "duckdb", "database": "mine.duckdb",
                                         "command": "CREATE TABLE t AS SELECT 7 AS a; SELECT a FROM t"}}]}  # fmt: skip
    res, store, events, kids = env(parent(child(step), ["duckdb"]))
    assert res.status == "completed", res.results
    assert res.results["start"]["rows"] == [{"a": 7}]
    # the sandbox worker's scratch folder (tools/sandbox_worker.py): inside the execution's own directory
    assert (env.data_dir / "generated" / kids[0] / "sandbox" / "mine.duckdb").is_file()
    # an absolute database path outside it is refused before DuckDB opens (or creates) anything
    outside = env.data_dir.parent / "outside.duckdb"
    step2 = {
        "step": "s",
        "tool": [
            {"d": {"kind": "duckdb", "database": "{{ '" + str(outside) + "' }}", "command": "SELECT 1"}}
        ],
    }
    res2, store2, _, kids2 = env(parent(child(step2), ["duckdb"]))
    err = _error_of(store2, kids2[0])
    assert err["kind"] == "trust_refused" and "outside this execution's directory" in err["message"]
    assert not outside.exists()


def test_a_scheme_prefix_does_not_walk_a_generated_duckdb_out_of_its_directory(env):
    """Issue 41: the gate skipped any value holding ``://``, DuckDB opens ``x://../..`` as a relative
    path: tenant acme's generated playbook read tenant globex's table and created a file outside."""
    globex = {"apiVersion": "noetl.io/v2", "kind": "Playbook", "metadata": {"name": "g", "path": "g"},
              "workflow": [{"step": "start", "tool": [{"d": {"kind": "duckdb", "database": "globex.duckdb",
                            "command": "CREATE TABLE payroll AS SELECT 'globex-payroll-42' AS s"}}]}]}  # fmt: skip
    assert env(globex, tenant="globex")[0].status == "completed"
    before = sorted(p for p in env.data_dir.parent.rglob("*") if "generated" not in p.parts)
    for task in ({"kind": "duckdb", "database": "x://../../../globex.duckdb", "command": "SELECT s FROM payroll"},
                 {"kind": "duckdb", "database": "x://../../../../escaped.duckdb",
                  "command": "CREATE TABLE t AS SELECT 1 AS a"},
                 {"kind": "duckdb", "database": "{{ 'x://' + '../../../globex.duckdb' }}",
                  "command": "SELECT s FROM payroll"}):  # fmt: skip
        res, store, events, kids = env(
            parent(child({"step": "s", "tool": [{"d": task}]}), ["duckdb"]), "acme"
        )
        assert res.status == "failed"
        err = _error_of(store, kids[0])
        assert err["kind"] == "trust_refused" and "outside this execution's directory" in err["message"], err
        assert "globex-payroll-42" not in _text(store.read(res.execution_id) + store.read(kids[0]))
    after = sorted(p for p in env.data_dir.parent.rglob("*") if "generated" not in p.parts)
    assert [p for p in after if p not in before and p.suffix != ".db" and "-wal" not in p.name
            and "-shm" not in p.name and "payloads" not in p.parts and "unrecorded" not in p.parts] == []  # fmt: skip
    assert not (env.data_dir.parent / "escaped.duckdb").exists()


def test_a_generated_ducklake_keeps_its_lake_in_its_own_directory(env):
    """A generated playbook's DuckLake: catalog file and data files in its own directory; a catalog
    outside it is refused before DuckDB opens anything, and SQL that attaches another lake is refused
    by DuckDB's own sandbox (the SQL is data to the gate)."""
    lake = {"kind": "ducklake", "catalog_connection": "lake.ducklake", "data_path": "files",
            "data_inlining_row_limit": 0}  # fmt: skip
    step = {
        "step": "s",
        "tool": [{"d": {**lake, "command": "CREATE TABLE t AS SELECT 7 AS a; SELECT a FROM t"}}],
    }
    res, store, events, kids = env(parent(child(step), ["ducklake"]))
    assert res.status == "completed", res.results
    assert res.results["start"]["rows"] == [{"a": 7}]
    own = env.data_dir / "generated" / kids[0]
    assert (own / "lake.ducklake").is_file() and list((own / "files").rglob("*.parquet"))
    outside = env.data_dir.parent / "outside.ducklake"
    for cfg in ({**lake, "catalog_connection": "{{ '" + str(outside) + "' }}", "command": "SELECT 1"},
                {**lake, "command": f"ATTACH 'ducklake:{outside}' AS evil (DATA_PATH '{outside}.files'); "
                                    "CREATE TABLE evil.t AS SELECT 1 AS a"}):  # fmt: skip
        res2, store2, _, kids2 = env(parent(child({"step": "s", "tool": [{"d": cfg}]}), ["ducklake"]))
        err = _error_of(store2, kids2[0])
        assert err["kind"] in ("trust_refused", "duckdb_error"), err
        assert (
            "outside this execution's directory" in err["message"]
            or "disabled by configuration" in err["message"]
        )
        assert not outside.exists()


# -- loop.cursor / task: Postgres with an inline auth URL -----------------------------------------


@pytest.mark.skipif(not _pg_up(), reason="needs the PostgreSQL at 127.0.0.1:5432")
@pytest.mark.parametrize("how", ["cursor_auth", "cursor_dsn_option", "task_auth", "task_connection_string"])
def test_an_inline_postgres_url_is_a_credential_that_was_not_delegated(env, how):
    claim = f"SELECT 1 AS id, usesuper FROM pg_user WHERE usename = current_user AND {PG_ONCE}"
    templated = "{{ '" + PG + "' }}"  # built at run time: the static walk cannot see it
    step = {
        "cursor_auth": cursor_step("postgres", claim, auth=templated, options={"key": "usesuper"}),
        "cursor_dsn_option": cursor_step("postgres", claim, options={"key": "usesuper", "dsn": templated}),
        "task_auth": {"step": "s", "tool": [{"q": {"kind": "postgres", "auth": templated,
                                                   "command": "SELECT usesuper FROM pg_user WHERE usename = current_user"}}]},
        "task_connection_string": {"step": "s", "tool": [{"q": {"kind": "postgres", "connection_string": templated,
                                                                "command": "SELECT 1"}}]},
    }[how]  # fmt: skip
    res, store, events, kids = env(parent(child(step), ["postgres", "noop"]))
    assert res.status == "failed"
    err = _error_of(store, kids[0])
    assert err["kind"] == "trust_refused" and "inline" in err["message"], err
    assert not [e for e in store.read(kids[0]) if e.name == "loop.frame.claimed"]
    assert not [e for e in store.read(kids[0]) if e.name == "task.done" and e.status == "success"]


@pytest.mark.skipif(not _pg_up(), reason="needs the PostgreSQL at 127.0.0.1:5432")
def test_the_delegated_credential_still_works_for_a_cursor_and_a_task(env):
    claim = f"SELECT 1 AS id FROM pg_user WHERE usename = current_user AND {PG_ONCE}"
    steps = [dict(cursor_step("postgres", claim, auth="pg_main"), next={"arcs": [{"step": "q"}]}),
             {"step": "q", "tool": [{"q": {"kind": "postgres", "auth": "pg_main", "command": "SELECT 1 AS one"}}]}]  # fmt: skip
    res, store, events, kids = env(parent(child(*steps), ["postgres", "noop"]))
    assert res.status == "completed", res.results
    assert res.results["start"]["rows"] == [{"one": 1}]
    assert [e.data["keys"] for e in store.read(kids[0]) if e.name == "loop.frame.claimed"] == [["1"]]
    assert SECRET not in _text(events)


# -- the worker's environment ------------------------------------------------------------------

PROBE_PY = """
import glob, os
def main():
    found = []
    for p in ['/proc/%d/environ' % os.getppid(), *glob.glob('/proc/[0-9]*/environ')]:
        try:
            if SECRET.encode() in open(p, 'rb').read():
                found.append(p)
        except OSError:
            pass
    return {'found': found, 'env_has_secret': any(SECRET in v for v in os.environ.values())}
""".replace("SECRET", repr(SECRET))
# the pattern is built in the shell, so that the command itself does not hold the secret
PROBE_SH = f"P='{SECRET[:6]}'; grep -l -a -F \"$P{SECRET[6:]}\" /proc/$PPID/environ /proc/[0-9]*/environ 2>/dev/null; true"


@pytest.mark.parametrize("kind", ["python", "shell"])
def test_generated_code_cannot_read_the_workers_environment_from_proc(tmp_path, kind):
    """The worker is the real CLI, started with the credential in its environment (as a deployment
    passes it). Its generated child's code looks for it in /proc/<ppid>/environ and every other
    /proc/<pid>/environ it can see."""
    task = ({"p": {"kind": "python", "code": PROBE_PY}} if kind == "python"
            else {"sh": {"kind": "shell", "command": PROBE_SH}})  # fmt: skip
    doc = parent(child({"step": "s", "tool": [task]}), [kind])
    path = tmp_path / "parent.yaml"
    path.write_text(yaml.safe_dump(doc))
    env = {**os.environ, "NOETL_CREDENTIAL_PG_MAIN": json.dumps({"type": "postgres", "data": {"db_password": SECRET}}),
           "PYTHONPATH": str(Path(__file__).resolve().parents[2])}  # fmt: skip
    proc = subprocess.run([sys.executable, "-m", "noetl_dagster.commands.main", "run", str(path), "--json", "-q",
                           "--event-store", f"sqlite:///{tmp_path / 'e.db'}", "--data-dir", str(tmp_path / "home")],
                          capture_output=True, text=True, env=env, timeout=120)  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = json.loads(proc.stdout)["results"]["start"]
    if kind == "python":
        assert out["found"] == [] and out["env_has_secret"] is False, out
    else:
        assert out["stdout"] == "", out
    assert SECRET not in proc.stdout


# -- a path the static walk never sees: a resumed log ----------------------------------------------


def test_a_resumed_generated_child_is_checked_at_dispatch(env, tmp_path):
    """Resume rebuilds a generated child from its log alone (no static walk): a kind the grant
    recorded on its request does not allow is refused when the task is dispatched."""
    step = {"step": "s", "tool": [{"d": {"kind": "duckdb", "command": "SELECT 1 AS one"}}]}
    res, store, events, kids = env(parent(child(step), ["duckdb"]))
    assert res.status == "completed", res.results
    log = store.read(kids[0])
    cut = next(i for i, e in enumerate(log) if e.name == "step.started" and e.step == "s")
    head = [e for e in log[:cut]]
    req = head[0]
    assert req.name == "playbook.execution.requested" and req.data["allowed_kinds"] == ["duckdb"]
    req.data["allowed_kinds"] = ["noop"]  # the grant this execution had (narrower than what it asks)
    crashed = f"sqlite:///{tmp_path / 'crashed.db'}"
    open_event_store(crashed).append(head)
    again = resume_execution(kids[0], event_store=crashed, data_dir=env.data_dir)
    assert again.status == "failed"
    err = again.results["s"]["error"]
    assert err["kind"] == "trust_refused" and "tool kind 'duckdb' is not allowed" in err["message"]


# -- the gate's rules on rendered configs ---------------------------------------------------------


@pytest.mark.parametrize(
    ("kind", "config", "expect"),
    [
        ("http", {"url": "http://u:pw@example.invalid/x"}, "user info"),
        ("http", {"url": "http://example.invalid", "auth": {"type": "bearer", "token": "t"}}, "inline auth"),
        ("http", {"url": "http://example.invalid", "auth": "other"}, "not delegated"),
        ("parquet", {"uri": "noetl://globex/p/tables/table/t", "data": []}, "tenant 'globex'"),
        # the locator's other spelling, and a scheme in capitals, reach the same tenant
        ("parquet", {"uri": "urn:noetl:globex:p:tables:table:t:1", "data": []}, "tenant 'globex'"),
        ("duckdb", {"command": "SELECT * FROM 'NOETL://globex/p/ns/table/t'"}, "tenant 'globex'"),
        ("parquet", {"uri": "noetl://acme/p/tables/table/t", "registry": "/tmp/r.db"}, "another registry"),
        ("parquet", {"uri": "noetl://acme/p/tables/table/t", "api_key": "k"}, "inline credential"),
        ("playbook", {"path": "/etc/passwd"}, "outside this execution's directory"),
        ("playbook", {"path": "x", "credentials": ["pg_main", "other"]}, "'other' is not delegated"),
        ("resource", {"op": "load", "uri": "file:///etc/hostname"}, "outside this execution's directory"),
        ("python", {"code": "x", "script": {"path": "../../x.py"}}, "outside this execution's directory"),
        ("nats", {"auth": "pg_main", "url": "nats://127.0.0.1:4222"}, "connection target inline"),
        ("nats", {"subject": "x"}, "only through a delegated credential"),
        ("postgres", {"auth": {"db_host": "127.0.0.1", "db_user": "postgres"}}, "inline auth"),
        ("secrets", {"name": "other"}, "not delegated"),
        ("shell", {"command": "true"}, "not allowed"),
        # ducklake: a catalog and data files of its own, Postgres and S3 only through delegated credentials
        ("ducklake", {"catalog_connection": "postgresql://127.0.0.1:5432/lake"}, "Postgres catalog inline"),
        (
            "ducklake",
            {"catalog_connection": "postgres:dbname=lake host=127.0.0.1"},
            "Postgres catalog inline",
        ),
        (
            "ducklake",
            {"catalog_connection": "ducklake:/srv/lake.ducklake"},
            "outside this execution's directory",
        ),
        (
            "ducklake",
            {"catalog_connection": "l.ducklake", "data_path": "/srv/files"},
            "outside this execution's directory",
        ),
        (
            "ducklake",
            {"catalog_connection": "l.ducklake", "data_path": "s3://b/p"},
            "never uses the worker's AWS",
        ),
        (
            "ducklake",
            {"catalog_connection": "l.ducklake", "data_path": "s3://b/p", "s3": {"key": "k", "secret": "s"}},
            "inline S3 settings",
        ),
        (
            "ducklake",
            {"catalog_connection": "l.ducklake", "data_path": "s3://b/p", "s3": {"credential": "other"}},
            "'other' is not delegated",
        ),
        (
            "ducklake",
            {"catalog_connection": "l.ducklake", "data_path": "gs://b/p"},
            "in its own directory, or on S3",
        ),
        ("ducklake", {"auth": "other", "catalog_name": "lake"}, "'other' is not delegated"),
        # issue 41.4: file URIs as kind: resource opens them (`file:` without `//`, any case, %-escapes)
        ("resource", {"op": "load", "uri": "file:/etc/hostname"}, "outside this execution's directory"),
        ("resource", {"op": "load", "uri": "FILE:///etc/hostname"}, "outside this execution's directory"),
        (
            "resource",
            {"op": "load", "uri": "file://localhost/etc/hostname"},
            "outside this execution's directory",
        ),
        (
            "resource",
            {"op": "load", "uri": "file:%2e%2e/%2e%2e/etc/hostname"},
            "outside this execution's directory",
        ),
        ("duckdb", {"database": "artifact://localfs/srv/a.duckdb"}, "outside this execution's directory"),
    ],
)
def test_gate_rules(tmp_path, kind, config, expect):
    from noetl_dagster.engine.trust import Gate, Grant

    gate = Gate(Grant(frozenset({"http", "parquet", "playbook", "resource", "python", "nats", "postgres", "secrets", "duckdb",
                                 "ducklake"}),
                      frozenset({"pg_main"}), frozenset({"example.invalid"})), "acme", str(tmp_path / "scope"))  # fmt: skip
    with pytest.raises(ToolError) as e:
        gate.check(kind, config, "task 't'")
    assert expect in e.value.message
    # what the grant allows passes
    gate.check("postgres", {"auth": "pg_main", "command": "SELECT '/etc/passwd', 'noetl://acme/y'"}, "t")
    gate.check("duckdb", {"database": str(tmp_path / "scope" / "a.duckdb"), "command": "SELECT 1"}, "t")
    gate.check("secrets", {"name": "pg_main"}, "t")
    gate.check(
        "ducklake", {"catalog_connection": "lake.ducklake", "data_path": "files", "command": "SELECT 1"}, "t"
    )
    gate.check("ducklake", {"auth": "pg_main", "data_path": "s3://b/p", "s3": {"credential": "pg_main"}}, "t")


def test_the_gate_holds_under_the_dagster_runner_too(env, tmp_path):
    """The gate sits in the engine's dispatch, which both runners share: the DuckDB cursor read and an
    inline Postgres URL computed at run time are refused inside a Dagster op as in the local runner."""
    import dagster as dg

    from noetl_dagster.resources.noetl import close_all_services
    from noetl_dagster.translator.runner import run_playbook_dagster

    read = cursor_step("duckdb", ONCE + "SELECT 1 AS id, content FROM read_text('/etc/hostname') WHERE (SELECT n FROM seen) = 1",
                       options={"key": "content"})  # fmt: skip
    pg = {
        "step": "q",
        "tool": [{"q": {"kind": "postgres", "auth": "{{ '" + PG + "' }}", "command": "SELECT 1"}}],
    }
    doc = child(read, pg)
    doc["workflow"][0]["next"] = {"spec": {"mode": "inclusive"}, "arcs": [{"step": "s"}, {"step": "q"}]}
    instance = dg.DagsterInstance.ephemeral()
    try:
        res = run_playbook_dagster(load_playbook_dict(parent(doc, ["duckdb", "postgres", "noop"])),
                                   event_store=env.store_url, data_dir=env.data_dir, instance=instance)  # fmt: skip
    finally:
        instance.dispose()
        close_all_services()
    assert res.status == "failed"
    store = open_event_store(env.store_url)
    kid = next(se.event.execution_id for se in store.iter_all() if se.event.name == "playbook.execution.requested"
               and se.event.parent_execution_id == res.execution_id)  # fmt: skip
    assert "file system operations are disabled" in _error_of(store, kid, "s")["message"]
    assert _error_of(store, kid, "q")["kind"] == "trust_refused"
    assert HOSTNAME not in _text([se.event for se in store.iter_all()])


def test_snowflake_transfer_names_a_delegated_credential_per_role(tmp_path):
    """Issue 41.4 (found by test_fuzz_trust_kinds): upstream's `auth: {sf: <name>, pg: <name>}` was
    refused as an inline record even with both names delegated; each role is now checked as a name,
    and an inline record or connection string in a role is still refused."""
    from noetl_dagster.engine.trust import Gate, Grant

    gate = Gate(Grant(frozenset({"snowflake_transfer"}), frozenset({"sf_main", "pg_main"}), frozenset()), "acme",
                str(tmp_path / "scope"))  # fmt: skip
    base = {"direction": "sf_to_pg", "source": {"query": "SELECT 1"}, "target": {"table": "t"}}
    gate.check("snowflake_transfer", {**base, "auth": {"sf": "sf_main", "pg": "pg_main"}}, "t")
    gate.check(
        "snowflake_transfer", {**base, "credentials": {"sf": {"key": "sf_main"}, "pg": "pg_main"}}, "t"
    )
    for auth, expect in [
        ({"sf": "sf_main", "pg": "pg_other"}, "'pg_other' is not delegated"),
        ({"sf": {"sf_account": "a", "sf_password": "p"}, "pg": "pg_main"}, "inline auth"),
        ({"sf": "sf_main", "pg": "postgresql://postgres@127.0.0.1/postgres"}, "inline connection string"),
        ({"sf": "sf_main", "pg": "pg_main", "db_host": "127.0.0.1"}, "inline auth"),
        (None, "connects only through a delegated credential"),
    ]:
        with pytest.raises(ToolError) as e:
            gate.check("snowflake_transfer", {**base, "auth": auth}, "t")
        assert expect in e.value.message, (auth, e.value.message)


def test_a_generated_playbooks_relative_file_is_its_own_not_the_workers(tmp_path, monkeypatch):
    """Issue 41.4 (found by test_fuzz_trust_kinds): `kind: resource` resolved a generated playbook's
    relative path against the worker's working directory (its playbook has no folder), so
    `uri: secret.txt` read the worker's file; relative paths are now the execution's own directory's."""
    from noetl_dagster.dsl import load_playbook_dict
    from noetl_dagster.runners.local import run_playbook

    cwd = tmp_path / "worker"
    cwd.mkdir()
    (cwd / "secret.txt").write_text("worker-secret-41")
    monkeypatch.chdir(cwd)
    child = {"apiVersion": "noetl.io/v2", "kind": "Playbook", "metadata": {"name": "g", "path": "generated/g"},
             "workflow": [{"step": "start", "tool": [{"t": {"kind": "resource", "op": "load", "uri": "secret.txt"}}]}]}  # fmt: skip
    root = {"apiVersion": "noetl.io/v2", "kind": "Playbook", "metadata": {"name": "r", "path": "tests/r41"},
            "executor": {"spec": {"generated": {"allow_kinds": ["resource"]}}},
            "workflow": [{"step": "start", "tool": [{"sub": {"kind": "playbook", "definition": child}}]}]}  # fmt: skip
    res = run_playbook(load_playbook_dict(root), None, event_store=f"sqlite:///{tmp_path / 'e.db'}",
                       data_dir=tmp_path / "home")  # fmt: skip
    assert res.status == "failed" and "worker-secret-41" not in json.dumps(res.to_json(), default=str)
    assert "home/generated/" in json.dumps(res.to_json(), default=str)  # looked in its own directory
