"""Issue 41: a sandboxed execution's in-process kinds (duckdb, python, rhai) run in one worker process
per execution inside the OS sandbox (tools/sandbox_worker.py), so a path bug in a tool reaches nothing
outside the execution's scratch folder.

Real parts: bubblewrap, DuckDB, the SQLite event store, the file payload store, the local runner and
Dagster's execute_in_process. The escape probes run code the Python checks never see (a raw DuckDB
connection, ``open``) inside the worker: only the OS sandbox stands between it and the files.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import duckdb
import pytest

from noetl_dagster.dsl import load_playbook_dict
from noetl_dagster.runners.local import run_playbook
from noetl_dagster.storage.event_stores import open_event_store
from noetl_dagster.storage.locator import RefRefused
from noetl_dagster.storage.payload import FilePayloadStore
from noetl_dagster.tools import sandbox, sandbox_worker
from noetl_dagster.tools.duckdb_tool import load_arrow_table
from noetl_dagster.tools.registry import ToolError


@pytest.fixture(autouse=True)
def _sandbox_here():
    # fail closed, not skipped: without bwrap a sandboxed task ends sandbox_unavailable
    assert sandbox.available(), sandbox.unavailable_reason()


GLOBEX = "globex-payroll-42"
HOST_PASSWD = Path("/etc/passwd").read_text().splitlines()[0]  # root's line: never in the sandbox's own


def child(*steps: dict) -> dict:
    arcs = [{"step": steps[0]["step"]}]
    return {"apiVersion": "noetl.io/v2", "kind": "Playbook", "metadata": {"name": "gen", "path": "generated/gen"},
            "workflow": [{"step": "start", "next": {"arcs": arcs}}, *steps]}  # fmt: skip


def parent(definition: dict, kinds=("duckdb", "python", "rhai")) -> dict:
    return {"apiVersion": "noetl.io/v2", "kind": "Playbook", "metadata": {"name": "parent", "path": "tests/parent"},
            "executor": {"spec": {"generated": {"allow_kinds": list(kinds), "allow_credentials": []}}},
            "workflow": [{"step": "start", "tool": [{"child": {"kind": "playbook", "definition": definition}}]}]}  # fmt: skip


# three steps: a DuckDB table made in one step is read in the next (the worker lives on), a result over
# the inline limit spills as Arrow, python and rhai answer from the same worker
PIPELINE = child(
    {"step": "a", "tool": [
        {"mk": {"kind": "duckdb", "command": "CREATE TABLE t AS SELECT range AS i FROM range(5)"}},
        {"py": {"kind": "python", "code": "import os\nprint('from the worker')\nresult = {'pid': os.getpid(), 'cwd': os.getcwd()}"}}],
     "next": {"arcs": [{"step": "b"}]}},
    {"step": "b", "tool": [
        {"q": {"kind": "duckdb", "command": "SELECT sum(i)::INT AS s FROM t"}},
        {"big": {"kind": "duckdb", "command": "SELECT range AS i, repeat('x', 64) AS pad FROM range(5000)"}}],
     "next": {"arcs": [{"step": "c"}]}},
    {"step": "c", "tool": [{"r": {"kind": "rhai", "code": "40 + 2"}}]},
)  # fmt: skip


@pytest.fixture
def home(tmp_path, monkeypatch):
    home = tmp_path / "home"
    monkeypatch.setenv("NOETL_DAGSTER_HOME", str(home))
    return home


def _kid(store, execution_id: str) -> str:
    return next(se.event.execution_id for se in store.iter_all() if se.event.name == "playbook.execution.requested"
                and se.event.parent_execution_id == execution_id)  # fmt: skip


def _outcomes(store, kid: str) -> dict[str, dict]:
    return {e.data["task"]: e.data["outcome"] for e in store.read(kid) if e.name == "task.done"}


def test_sandboxed_tasks_run_in_one_worker_per_execution(home, tmp_path):
    url = f"sqlite:///{tmp_path / 'events.db'}"
    res = run_playbook(
        load_playbook_dict(parent(PIPELINE)), None, event_store=url, data_dir=home, tenant="acme"
    )
    assert res.status == "completed", res.results
    store = open_event_store(url)
    kid = _kid(store, res.execution_id)
    assert sandbox_worker.STARTS[kid] == 1  # five tasks in three steps: the worker started once
    out = _outcomes(store, kid)
    assert all(o["status"] == "ok" for o in out.values()), out
    assert out["q"]["result"]["rows"] == [{"s": 10}]
    assert out["r"]["result"] == 42
    py = out["py"]["result"]
    assert py["pid"] != os.getpid() and py["cwd"] == str((home / "generated" / kid / "sandbox").resolve())
    # the spilled result: moved into the execution's payload store by the parent, checksum verified on read
    ref = out["big"]["result"]["rows"]["$ref"]
    assert ref["store"] == "file" and ref["uri"].startswith(f"file://{home / 'payloads'}")
    # signed for the execution's tenant (storage/locator.py): it reads, another tenant's reader is refused
    table = load_arrow_table(out["big"]["result"], FilePayloadStore(home / "payloads"), ("acme", "default"))
    with pytest.raises(RefRefused):
        load_arrow_table(out["big"]["result"], FilePayloadStore(home / "payloads"), ("globex", "default"))
    assert table.num_rows == 5000 and table.column("i").to_pylist()[-1] == 4999
    assert not list((home / "generated" / kid / "sandbox" / sandbox_worker.SPILL_DIR).glob("*"))
    assert "from the worker" in json.dumps([e.to_dict() for e in store.read(kid)], default=str)


@pytest.fixture
def other_tenant(home, tmp_path):
    """What a sandboxed task must never read: another tenant's DuckDB and payload, the event db."""
    home.mkdir(parents=True, exist_ok=True)
    db = home / "globex.duckdb"
    with duckdb.connect(str(db)) as g:
        g.execute(f"CREATE TABLE payroll AS SELECT '{GLOBEX}' AS s")
    payload = home / "payloads" / "globex" / "p" / "x" / "result.json"
    payload.parent.mkdir(parents=True)
    payload.write_text(json.dumps({"secret": GLOBEX}))
    events = tmp_path / "events.db"
    return {"duckdb": str(db), "payload": str(payload), "events": str(events), "passwd": "/etc/passwd"}


class _Ctx:
    """The parent's view of one task, as the engine's ToolContext gives it (what the worker reads)."""

    def __init__(self, home: Path, execution_id: str, task: str = "t"):
        self.execution_id, self.step, self.task, self.attempt = execution_id, "s", task, 1
        self.tenant, self.project, self.spec, self.restricted = "acme", "p", {}, True
        self.scope_dir = str(home / "generated" / execution_id)
        self.data_dir = self.scope_dir
        self.render_context: dict = {}
        self.payloads = FilePayloadStore(home / "payloads")
        self.logs: list[str] = []

    def log(self, message: str) -> None:
        self.logs.append(message)

    def redact(self, value: str) -> None:
        pass


PROBE = """
import duckdb, json
out = {}
for name, path in targets.items():
    try:
        with open(path, 'rb') as f:
            out[name] = f.read()[:200].decode(errors='replace')
    except OSError as e:
        out[name] = 'refused: ' + type(e).__name__
try:
    out['duckdb_raw'] = str(duckdb.connect(targets['duckdb'], read_only=True).execute('SELECT s FROM payroll').fetchall())
except Exception as e:
    out['duckdb_raw'] = 'refused: ' + type(e).__name__
result = out
"""


def test_the_worker_reaches_no_file_outside_its_scratch_even_past_every_python_check(home, other_tenant):
    """A path bug simulated by code no Python gate sees: ``open`` and a raw DuckDB connection inside
    the worker, on absolute paths of another tenant's DuckDB and payload, the event db and the host's
    /etc/passwd. Only the OS sandbox stands between them and the files, and it holds."""
    ctx = _Ctx(home, "01a0000a-0000-7000-8000-00000000000a")
    worker = sandbox_worker.SandboxPort().start(ctx)
    try:
        got = worker.call("python", {"code": PROBE, "input": {"targets": other_tenant}}, ctx)
        for name in ("duckdb", "payload", "events", "duckdb_raw"):
            assert got[name].startswith("refused: "), (name, got[name])
        assert HOST_PASSWD not in got["passwd"]  # the sandbox's own synthetic /etc/passwd, or none
        # kind duckdb with the absolute path: refused by the tool's own check, and would be by the OS
        with pytest.raises(ToolError) as e:
            worker.call(
                "duckdb", {"database": other_tenant["duckdb"], "command": "SELECT s FROM payroll"}, ctx
            )
        assert GLOBEX not in str(e.value.message)
        # results still come back right from the same worker
        assert worker.call("duckdb", {"command": "SELECT 6 * 7 AS x"}, ctx)["rows"] == [{"x": 42}]
        assert worker.call("rhai", {"code": "1 + 1"}, ctx) == 2
    finally:
        worker.close()
    assert sandbox_worker.STARTS[ctx.execution_id] == 1


def test_a_generated_playbooks_tasks_read_nothing_of_another_tenant(home, tmp_path, other_tenant):
    """Through the engine: the probe as a generated playbook's python task, and kind duckdb on the
    other tenant's file spelled as an absolute path and with a scheme prefix."""
    url = f"sqlite:///{other_tenant['events']}"
    doc = child({"step": "s", "tool": [
        {"probe": {"kind": "python", "code": PROBE, "input": {"targets": other_tenant}}},
        {"db": {"kind": "duckdb", "database": "{{ 'x://../../../' + 'globex.duckdb' }}", "command": "SELECT s FROM payroll"}}]})  # fmt: skip
    res = run_playbook(load_playbook_dict(parent(doc)), None, event_store=url, data_dir=home, tenant="acme")
    store = open_event_store(url)
    out = _outcomes(store, _kid(store, res.execution_id))
    probe = out["probe"]["result"]
    assert all(probe[k].startswith("refused: ") for k in ("duckdb", "payload", "events", "duckdb_raw")), probe
    assert out["db"]["status"] == "error" and GLOBEX not in json.dumps(out, default=str)


def test_the_worker_dies_with_its_execution_and_a_crash_is_an_error_outcome(home):
    ctx = _Ctx(home, "01a0000a-0000-7000-8000-00000000000b")
    worker = sandbox_worker.SandboxPort().start(ctx)
    try:
        assert worker.call("python", {"code": "result = 1"}, ctx) == 1
        pid = worker._proc.pid  # noqa: SLF001 - the launcher's pid, to see it gone
        with pytest.raises(ToolError) as e:  # the worker process itself dies mid-task
            worker.call("python", {"code": "import os\nos._exit(3)"}, ctx)
        assert e.value.kind == "sandbox_worker"
        assert worker.call("python", {"code": "result = 2"}, ctx) == 2  # the next task starts a new one
        assert sandbox_worker.STARTS[ctx.execution_id] == 2
    finally:
        worker.close()
    assert not Path(f"/proc/{pid}").exists() or "zombie" in Path(f"/proc/{pid}/status").read_text().lower()


def _trace(store, kid: str) -> list[tuple]:
    """The child execution's events as both runners must give them (ids and times left out)."""
    out = []
    for e in store.read(kid):
        d = e.data or {}
        outcome = d.get("outcome") or {}
        out.append((e.name, e.step, d.get("task"), e.status, json.dumps(outcome.get("result"), sort_keys=True, default=str)
                    if "pid" not in json.dumps(outcome.get("result"), default=str) else "pid"))  # fmt: skip
    return out


def test_both_runners_give_the_same_trace(home, tmp_path):
    import dagster as dg

    from noetl_dagster.resources.noetl import close_all_services
    from noetl_dagster.translator.runner import run_playbook_dagster

    doc = child(*PIPELINE["workflow"][1:])
    doc["workflow"][2]["tool"] = doc["workflow"][2]["tool"][:1]  # no spill: its uri names the execution
    local_url, dagster_url = f"sqlite:///{tmp_path / 'local.db'}", f"sqlite:///{tmp_path / 'dagster.db'}"
    res = run_playbook(
        load_playbook_dict(parent(doc)), None, event_store=local_url, data_dir=home, tenant="acme"
    )
    instance = dg.DagsterInstance.ephemeral()
    try:
        res2 = run_playbook_dagster(load_playbook_dict(parent(doc)), event_store=dagster_url, data_dir=home,
                                    tenant="acme", instance=instance)  # fmt: skip
    finally:
        instance.dispose()
        close_all_services()
    assert res.status == res2.status == "completed"
    local, dagster = open_event_store(local_url), open_event_store(dagster_url)
    kid, kid2 = _kid(local, res.execution_id), _kid(dagster, res2.execution_id)
    assert _trace(local, kid) == _trace(dagster, kid2)
    assert sandbox_worker.STARTS[kid] == sandbox_worker.STARTS[kid2] == 1


def test_a_forged_spill_from_the_worker_moves_nothing_from_outside(home, tmp_path):
    """The worker runs the tenant's code, so its reply is untrusted: a spilled-result reference whose
    folder is a planted symlink to a host folder (holding a file of the right name), or whose file is a
    FIFO, is refused; nothing of the host file reaches the payload store."""
    name = "ab" * 32 + ".bin"
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / name).write_text(GLOBEX)
    ctx = _Ctx(home, "01a0000a-0000-7000-8000-00000000000c")
    forged = {
        "$ref": {"store": "sandbox", "uri": f"sandbox:{name}", "format": "arrow", "size": 1, "checksum": "x"}
    }
    plant = {"link": f"import os\nos.symlink({str(outside)!r}, '.spill')\nresult = {forged!r}",
             "fifo": f"import os\nos.remove('.spill')\nos.mkdir('.spill')\nos.mkfifo('.spill/{name}')\nresult = {forged!r}"}  # fmt: skip
    worker = sandbox_worker.SandboxPort().start(ctx)
    try:
        for how in ("link", "fifo"):
            with pytest.raises(ToolError) as e:
                worker.call("python", {"code": plant[how]}, ctx)
            assert e.value.kind == "sandbox_worker", (how, e.value.message)
    finally:
        worker.close()
    stored = [p.read_text(errors="replace") for p in (home / "payloads").rglob("*") if p.is_file()]
    assert not any(GLOBEX in s for s in stored)
    assert (outside / name).read_text() == GLOBEX  # and the host file was not removed either


def _workers(scratch: str) -> list[int]:
    """Live processes running a worker on ``scratch`` (its path is the worker's last argument)."""
    out = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if b"child_main()" in b" ".join(argv) and scratch.encode() in argv and state != "Z":
            out.append(int(pid))
    return out


def test_the_worker_ends_with_its_execution_and_dies_with_a_killed_parent(home, tmp_path):
    import signal
    import subprocess
    import sys
    import time

    url = f"sqlite:///{tmp_path / 'events.db'}"
    res = run_playbook(load_playbook_dict(parent(PIPELINE)), None, event_store=url, data_dir=home)
    store = open_event_store(url)
    kid = _kid(store, res.execution_id)
    assert res.status == "completed" and sandbox_worker.STARTS[kid] == 1
    assert _workers(str((home / "generated" / kid / "sandbox").resolve())) == []  # closed with the execution
    # a parent killed outright (no close, no cleanup): the worker goes with it
    ctx_home = tmp_path / "crash"
    script = (
        "import sys; sys.path.insert(0, 'tests/security'); from pathlib import Path\n"
        "from test_sandbox_worker import _Ctx\nfrom noetl_dagster.tools import sandbox_worker\n"
        f"ctx = _Ctx(Path({str(ctx_home)!r}), '01a0000a-0000-7000-8000-00000000000d')\n"
        "w = sandbox_worker.SandboxPort().start(ctx)\nprint(w.call('rhai', {'code': '1 + 1'}, ctx), w.scratch, flush=True)\n"
        "import time; time.sleep(600)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True,
                            cwd=Path(__file__).resolve().parents[2])  # fmt: skip
    try:
        answer, scratch = proc.stdout.readline().split()
        assert answer == "2" and _workers(scratch)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        for _ in range(200):  # the kernel's death signal is asynchronous: wait for it, bounded
            if not _workers(scratch):
                break
            time.sleep(0.05)
        assert _workers(scratch) == []
    finally:
        proc.kill()
        proc.wait()


def test_the_workers_cpu_is_charged_to_the_task_that_spent_it(home, tmp_path):
    """The worker lives on between tasks, so no task reaps it: its CPU is read from /proc per task
    (live_child_cpu_s), else a sandboxed task would show none of the CPU it burned."""
    url = f"sqlite:///{tmp_path / 'events.db'}"
    burn = "result = sum(i * i for i in range(2_000_000))"
    doc = child(
        {
            "step": "s",
            "tool": [{"warm": {"kind": "rhai", "code": "1"}}, {"burn": {"kind": "python", "code": burn}}],
        }
    )
    res = run_playbook(load_playbook_dict(parent(doc)), None, event_store=url, data_dir=home)
    store = open_event_store(url)
    usage = _outcomes(store, _kid(store, res.execution_id))["burn"]["meta"]["usage"]
    assert usage.get("child_cpu_s", 0) > 0, usage


def test_the_operators_opt_out_runs_the_kinds_in_process(home, tmp_path, monkeypatch):
    monkeypatch.setenv("NOETL_GENERATED_ISOLATION", "env-only")
    url = f"sqlite:///{tmp_path / 'events.db'}"
    doc = child(
        {
            "step": "s",
            "tool": [
                {"q": {"kind": "duckdb", "command": "SELECT 42 AS x"}},
                {"r": {"kind": "rhai", "code": "2"}},
            ],
        }
    )
    res = run_playbook(load_playbook_dict(parent(doc)), None, event_store=url, data_dir=home)
    store = open_event_store(url)
    kid = _kid(store, res.execution_id)
    out = _outcomes(store, kid)
    assert out["q"]["result"]["rows"] == [{"x": 42}] and out["r"]["result"] == 2
    assert sandbox_worker.STARTS[kid] == 0


def test_a_task_over_its_timeout_stops_the_worker_and_the_next_task_starts_a_new_one(home):
    ctx = _Ctx(home, "01a0000a-0000-7000-8000-00000000000e")
    worker = sandbox_worker.SandboxPort().start(ctx)
    try:
        ctx.spec = {"timeout": 1}
        with pytest.raises(ToolError) as e:
            worker.call("python", {"code": "while True:\n    pass"}, ctx)
        assert e.value.kind == "timeout" and e.value.retryable
        ctx.spec = {}
        assert worker.call("rhai", {"code": "3"}, ctx) == 3
        assert sandbox_worker.STARTS[ctx.execution_id] == 2
    finally:
        worker.close()
