"""Issue 41 part 1a: a generated playbook's code (and a sandbox policy's) runs in the OS sandbox.

The attacker's probe, replayed against real parts (the real SQLite event store and its WAL, a
credentials file, another tenant's payload, the real PostgreSQL at 127.0.0.1:5432, a real HTTP
server on 127.0.0.1): python and shell code of a generated child, and of an authored playbook with
``executor.spec.isolation: sandbox`` or the operator's ``NOETL_SANDBOX`` policy, reach none of it,
and the rlimits end a fork bomb, a big file and a big allocation as an error outcome with events.
"""

from __future__ import annotations

import ast
import http.server
import json
import os
import sys
import threading
from pathlib import Path

import pytest

from noetl_dagster.dsl import load_playbook_dict
from noetl_dagster.runners.local import run_playbook
from noetl_dagster.storage.event_stores import open_event_store
from noetl_dagster.tools import sandbox

SECRET = "kc-Sandb0x-secret-never-readable"
HOST_PASSWD = Path("/etc/passwd").read_text()
REPO = Path(__file__).resolve().parents[2]  # its package source shows read-only inside, nothing else


def _generated(task: dict, kinds: list[str], hosts: list[str] | None = None) -> dict:
    child = {"apiVersion": "noetl.io/v2", "kind": "Playbook", "metadata": {"name": "gen", "path": "generated/gen"},
             "workflow": [{"step": "start", "next": {"arcs": [{"step": "s"}]}}, {"step": "s", "tool": [task]}]}  # fmt: skip
    gen = {"allow_kinds": kinds, "allow_credentials": [], **({"allow_hosts": hosts} if hosts else {})}
    return {"apiVersion": "noetl.io/v2", "kind": "Playbook", "metadata": {"name": "parent", "path": "tests/parent"},
            "executor": {"spec": {"generated": gen}},
            "workflow": [{"step": "start", "tool": [{"child": {"kind": "playbook", "definition": child}}]}]}  # fmt: skip


def _authored(task: dict) -> dict:
    return {"apiVersion": "noetl.io/v2", "kind": "Playbook", "metadata": {"name": "mine", "path": "tests/mine"},
            "executor": {"spec": {"isolation": "sandbox"}}, "workflow": [{"step": "start", "tool": [task]}]}  # fmt: skip


class _Hello(http.server.BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 - the stdlib's name
        body = b"hello-from-" + self.server.name.encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *a):
        pass


@pytest.fixture
def world(tmp_path, monkeypatch):
    """A worker's data dir as the attacker found it: credentials, another tenant's payload, the
    event DB with its WAL; two real HTTP servers (one allowed, one not)."""
    home = tmp_path / "home"
    (home / "payloads" / "other-tenant" / "proj").mkdir(parents=True)
    keychain = home / "credentials.yaml"
    keychain.write_text(f"credentials:\n  pg_main: {{type: postgres, data: {{db_password: {SECRET}}}}}\n")
    other = home / "payloads" / "other-tenant" / "proj" / "result.json"
    other.write_text(json.dumps({"card": SECRET}))
    monkeypatch.setenv("NOETL_DAGSTER_HOME", str(home))
    monkeypatch.delenv("NOETL_SANDBOX", raising=False)
    db = home / "events.db"
    servers = []
    for name in ("allowed", "denied"):
        srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Hello)
        srv.name = name
        threading.Thread(target=srv.serve_forever, daemon=True).start()
        servers.append(srv)

    class World:
        data_dir = home
        paths = {"keychain": str(keychain), "other_tenant": str(other), "events_db": str(db),
                 "events_wal": str(db) + "-wal", "root": "/root", "work": "/work"}  # fmt: skip
        allowed = f"127.0.0.1:{servers[0].server_address[1]}"
        denied = f"127.0.0.1:{servers[1].server_address[1]}"

        def run(self, doc: dict, **kw):
            url = f"sqlite:///{db}"
            res = run_playbook(load_playbook_dict(doc), None, event_store=url, data_dir=home, **kw)
            store = open_event_store(url)
            return res, [se.event for se in store.iter_all()]

    yield World()
    for srv in servers:
        srv.shutdown()


def _probe_py(w) -> str:
    return f"""
import json, os, socket, urllib.request
paths = {json.dumps(w.paths)}
out = {{}}
for name, p in paths.items():
    try:
        out[name] = 'READ ' + (open(p, errors='replace').read(200) if os.path.isfile(p) else str(os.listdir(p)))
    except OSError as e:
        out[name] = type(e).__name__
try:
    open(paths['events_db'], 'r+b').close(); out['events_db_write'] = 'OPENED'
except OSError as e:
    out['events_db_write'] = type(e).__name__
out['passwd'] = open('/etc/passwd').read()
try:
    socket.create_connection(('127.0.0.1', 5432), timeout=3).close(); out['postgres'] = 'CONNECTED'
except OSError as e:
    out['postgres'] = type(e).__name__
for name, hp in (('allowed', {w.allowed!r}), ('denied', {w.denied!r})):
    try:
        out[name] = urllib.request.urlopen('http://' + hp + '/', timeout=5).read().decode()
    except Exception as e:
        out[name] = type(e).__name__ + ': ' + str(e)[:200]
result = out
"""


def _assert_confined(out: dict, proxy: bool = False) -> None:
    for name in ("keychain", "other_tenant", "events_db", "events_wal"):
        assert not str(out[name]).startswith("READ"), (name, out[name])
    # /root and /work show at most the folders that lead to the read-only runtime (python, venv, package)
    leads = {part for p in sandbox._runtime_dirs() for part in Path(p).parts[2:3]}
    for name in ("root", "work"):
        if str(out[name]).startswith("READ"):
            assert set(ast.literal_eval(out[name][5:])) <= leads, (name, out[name], leads)
    assert SECRET not in json.dumps(out)
    assert out["events_db_write"] != "OPENED"
    assert out["passwd"] != HOST_PASSWD and "root:" not in out["passwd"], out["passwd"]
    assert out["postgres"] != "CONNECTED"
    assert "hello-from-denied" not in out["denied"], out["denied"]


@pytest.fixture(autouse=True)
def _needs_the_sandbox():
    # fail closed, not skipped: without bwrap these runs end in sandbox_unavailable and the asserts fail
    assert sandbox.available(), sandbox.unavailable_reason()


def test_generated_python_reaches_none_of_the_workers_files_or_network(world):
    res, events = world.run(_generated({"p": {"kind": "python", "code": _probe_py(world)}}, ["python"]))
    assert res.status == "completed", res.results
    _assert_confined(res.results["start"])
    assert "hello-from" not in res.results["start"]["allowed"]  # no allow_hosts: no network at all


def test_generated_python_reaches_its_allow_hosts_through_the_egress_proxy_only(world):
    doc = _generated({"p": {"kind": "python", "code": _probe_py(world)}}, ["python"], hosts=[world.allowed])
    res, events = world.run(doc)
    assert res.status == "completed", res.results
    out = res.results["start"]
    _assert_confined(out)
    assert out["allowed"] == "hello-from-allowed", out
    assert "403" in out["denied"] and "not in allow_hosts" not in SECRET, out["denied"]
    logs = json.dumps([e.data for e in events if "egress refused" in json.dumps(e.data or {})])
    assert world.denied in logs  # the refusal is in the execution's events


CONNECT_PY = """
import os, socket
def tunnel(hp):
    s = socket.create_connection(('127.0.0.1', int(os.environ['HTTPS_PROXY'].rsplit(':', 1)[1])), timeout=10)
    s.sendall(('CONNECT %s HTTP/1.1\\r\\nHost: %s\\r\\n\\r\\n' % (hp, hp)).encode())
    head = s.recv(4096).decode()
    if ' 200 ' not in head.split('\\r\\n')[0]:
        return head.split('\\r\\n')[0]
    s.sendall(b'GET / HTTP/1.0\\r\\n\\r\\n')
    data = b''
    while chunk := s.recv(4096):
        data += chunk
    return data.decode().split('\\r\\n\\r\\n', 1)[1]
result = {'allowed': tunnel(ALLOWED), 'denied': tunnel(DENIED), 'pg': tunnel('127.0.0.1:5432')}
"""


def test_connect_tunnels_only_to_allow_hosts(world):
    code = f"ALLOWED, DENIED = {world.allowed!r}, {world.denied!r}\n" + CONNECT_PY
    res, _ = world.run(_generated({"p": {"kind": "python", "code": code}}, ["python"], hosts=[world.allowed]))
    assert res.status == "completed", res.results
    out = res.results["start"]
    assert out["allowed"] == "hello-from-allowed", out
    assert out["denied"].startswith("HTTP/1.1 403") and out["pg"].startswith("HTTP/1.1 403"), out


def test_authored_python_with_isolation_sandbox_is_confined_too(world):
    res, events = world.run(_authored({"p": {"kind": "python", "code": _probe_py(world)}}))
    assert res.status == "completed", res.results
    _assert_confined(res.results["start"])


def test_the_tenant_policy_sandboxes_an_authored_playbook(world, monkeypatch):
    monkeypatch.setenv("NOETL_SANDBOX", "acme/other, t1")
    doc = _authored({"p": {"kind": "python", "code": "import os\nresult = os.getuid()"}})
    del doc["executor"]
    box = range(sandbox.SANDBOX_UID_BASE, sandbox.SANDBOX_UID_BASE + sandbox.SANDBOX_UID_COUNT)
    for tenant, project, boxed in (
        ("t1", "default", True),
        ("acme", "other", True),
        ("acme", "default", False),
    ):
        res, _ = world.run(doc, tenant=tenant, project=project)
        assert res.status == "completed", res.results
        assert (res.results["start"] in box) is boxed, (tenant, project, res.results)


def _probe_sh(w) -> str:
    p = w.paths
    reads = "; ".join(
        f"cat {p[n]} >/dev/null 2>&1 && echo READ:{n}"
        for n in ("keychain", "other_tenant", "events_db", "events_wal")
    )
    return (f"{reads}; cat {REPO / 'pyproject.toml'} >/dev/null 2>&1 && echo REPO; ( : >> {p['events_db']} ) 2>/dev/null && echo WROTE; "
            "grep -q '^root:' /etc/passwd && echo PASSWD; "
            "python3 -c \"import socket; socket.create_connection(('127.0.0.1', 5432), 3)\" 2>/dev/null && echo PG; "
            f"python3 -c \"import urllib.request as u; print(u.urlopen('http://{w.denied}/', timeout=5).read().decode())\" 2>/dev/null; true")  # fmt: skip


@pytest.mark.parametrize("how", ["generated", "authored"])
def test_shell_reaches_none_of_the_workers_files_or_network(world, how):
    task = {"sh": {"kind": "shell", "command": _probe_sh(world)}}
    doc = _generated(task, ["shell"]) if how == "generated" else _authored(task)
    res, _ = world.run(doc)
    assert res.status == "completed", res.results
    assert res.results["start"]["stdout"] == "", res.results["start"]


def _error(events, step: str = "s") -> dict:
    for e in reversed(events):
        if e.step == step and e.status == "error" and e.name == "task.done":
            return (e.data or {}).get("outcome", {}).get("error") or (e.data or {}).get("error")
    raise AssertionError("no task.done error event")


def _run_limited(world, monkeypatch, task: dict, how: str = "generated", **limits: str):
    for k, v in limits.items():
        monkeypatch.setenv(f"NOETL_SANDBOX_{k}", v)
    doc = _generated(task, [next(iter(task.values()))["kind"]]) if how == "generated" else _authored(task)
    res, events = world.run(doc)
    assert res.status == "failed", res.results
    return _error(events, "s" if how == "generated" else "start")


FORK_PY = """
import os, time
pids = []
try:
    for _ in range(500):
        pid = os.fork()
        if pid == 0:
            time.sleep(60); os._exit(0)
        pids.append(pid)
except OSError as e:
    raise RuntimeError(f"fork refused after {len(pids)} children: {e.strerror}")
result = len(pids)
"""


@pytest.mark.parametrize("how", ["generated", "authored"])
def test_a_fork_bomb_is_bounded(world, monkeypatch, how):
    err = _run_limited(world, monkeypatch, {"p": {"kind": "python", "code": FORK_PY}}, how, PROCESSES="24")
    assert "fork refused after" in err["message"], err
    assert int(err["message"].split("after ")[1].split()[0]) < 24


def test_a_shell_fork_bomb_is_bounded(world, monkeypatch):
    cmd = "i=0; while [ $i -lt 500 ]; do sleep 60 & i=$((i+1)); done; echo all-started"
    err = _run_limited(world, monkeypatch, {"sh": {"kind": "shell", "command": cmd}}, PROCESSES="24")
    assert err["kind"] == "exit_code", err


def test_a_big_file_is_refused(world, monkeypatch):
    code = "open('big', 'wb').write(b'x' * (3 << 20))\nresult = 'wrote'"
    err = _run_limited(world, monkeypatch, {"p": {"kind": "python", "code": code}}, FILE_MB="1")
    assert "File too large" in err["message"], err
    shell = {"sh": {"kind": "shell", "command": "head -c 3000000 /dev/zero > big2"}}
    err = _run_limited(world, monkeypatch, shell, FILE_MB="1")
    assert err["kind"] == "exit_code" and "file-size limit" in err["message"], err


@pytest.mark.parametrize("how", ["generated", "authored"])
def test_memory_is_bounded(world, monkeypatch, how):
    code = "blob = bytearray(3 << 30)\nresult = len(blob)"
    err = _run_limited(world, monkeypatch, {"p": {"kind": "python", "code": code}}, how, MEMORY_MB="1024")
    assert "MemoryError" in err["message"], err


def test_a_bad_limit_setting_is_one_clear_error(world, monkeypatch):
    err = _run_limited(world, monkeypatch, {"p": {"kind": "python", "code": "result = 1"}}, MEMORY_MB="lots")
    assert err["message"] == "NOETL_SANDBOX_MEMORY_MB must be a positive integer, got 'lots'", err


@pytest.mark.parametrize("kind", ["python", "shell", "script"])
def test_where_the_sandbox_cannot_be_built_generated_code_is_refused(world, monkeypatch, kind):
    task = {"python": {"p": {"kind": "python", "code": "result = 1"}},
            "shell": {"sh": {"kind": "shell", "command": "echo ran"}},
            "script": {"sc": {"kind": "script", "code": "echo ran"}}}[kind]  # fmt: skip
    monkeypatch.setattr(sandbox, "_probe", "bwrap not installed (Debian: bubblewrap, util-linux)")
    res, events = world.run(_generated(task, [kind]))
    assert res.status == "failed"
    err = _error(events)
    assert err["kind"] == "sandbox_unavailable" and "\n" not in err["message"], err
    assert "ran" not in json.dumps(res.results)
    # the operator's explicit opt-out runs it with a scrubbed environment only
    monkeypatch.setenv("NOETL_GENERATED_ISOLATION", "env-only")
    res, _ = world.run(_generated(task, [kind]))
    assert res.status == "completed", res.results


def test_generated_shell_reaches_its_allow_hosts_through_the_egress_proxy(world):
    get = (
        "python3 -c \"import urllib.request as u; print(u.urlopen('http://{}/', timeout=5).read().decode())\""
    )
    cmd = f"{get.format(world.allowed)}; {get.format(world.denied)} 2>&1 | tail -1"
    res, _ = world.run(
        _generated({"sh": {"kind": "shell", "command": cmd}}, ["shell"], hosts=[world.allowed])
    )
    assert res.status == "completed", res.results
    out = res.results["start"]["stdout"]
    assert out.startswith("hello-from-allowed\n") and "403" in out and "hello-from-denied" not in out, out


MCP_SERVER = """
import os
from mcp.server.mcpserver import MCPServer
app = MCPServer("probe")

@app.tool()
def probe(path: str) -> str:
    try:
        return "READ " + open(path).read(100)
    except OSError as e:
        return type(e).__name__ + " uid=" + str(os.getuid())

app.run()
"""


@pytest.mark.slow  # an MCP server process / a Dagster instance
def test_a_generated_mcp_stdio_server_runs_in_the_sandbox(world):
    task = {"m": {"kind": "mcp", "command": sys.executable, "args": ["-c", MCP_SERVER], "tool": "probe",
                  "arguments": {"path": world.paths["keychain"]}}}  # fmt: skip
    res, _ = world.run(_generated(task, ["mcp"]))
    assert res.status == "completed", res.results
    text = res.results["start"]["text"]
    assert text.startswith("FileNotFoundError") and SECRET not in text, text


def test_a_timed_out_sandboxed_command_leaves_no_process_behind(world):
    marker = "sleep 4141"
    task = {"sh": {"kind": "shell", "command": marker, "timeout_seconds": 1}}
    res, events = world.run(_generated(task, ["shell"]))
    assert res.status == "failed" and _error(events)["kind"] == "timeout"
    # --die-with-parent: killing bwrap (the timeout) takes the sandboxed process with it
    for _ in range(50):
        left = [p for p in Path("/proc").iterdir() if p.name.isdigit() and _cmdline(p) == marker]
        if not left:
            break
        threading.Event().wait(0.1)
    assert not left


def _cmdline(p: Path) -> str:
    try:
        return (p / "cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
    except OSError:
        return ""


def test_executor_spec_isolation_is_validated(tmp_path):
    import yaml

    from noetl_dagster.dsl.files import check_file_with_warnings

    doc = _authored({"p": {"kind": "python", "code": "result = 1"}})
    path = tmp_path / "pb.yaml"
    for value, ok in (("sandbox", True), ("jail", False)):
        doc["executor"]["spec"]["isolation"] = value
        path.write_text(yaml.safe_dump(doc))
        _, issues, _ = check_file_with_warnings(path)
        assert ("executor-isolation" not in {i.rule for i in issues}) is ok, [str(i) for i in issues]


NON_ROOT = """
import json, os, subprocess, sys
sys.path[:0] = json.loads(sys.argv[1])
from noetl_dagster.tools import sandbox
home = sys.argv[2]
secret = os.path.join(home, 'worker-own.txt')
open(secret, 'w').write('worker-own-file')
box = sandbox.confine(['/bin/sh', '-c', 'id -u; cat %s || true; echo mine > f; cat f' % secret],
                      scratch=sandbox.scratch_dir(os.path.join(home, 'x'), 'e1'), execution_id='e1')
r = subprocess.run(box.argv, env=box.env, cwd=box.cwd, capture_output=True, text=True)
print(json.dumps({'uid': os.getuid(), 'rc': r.returncode, 'out': r.stdout, 'err': r.stderr, 'box_uid': box.uid}))
"""


def test_a_non_root_worker_is_confined_by_the_user_namespace():
    """A worker that is not root keeps its uid outside (bwrap's user namespace is the confinement):
    its own files, readable to it, are still out of the sandbox's sight. Run as root (CI), the worker
    is started as uid 65534 with the system python (the venv's python may sit under /root)."""
    import shutil
    import subprocess
    import tempfile

    site = [str(REPO), *(p for p in sys.path if p.endswith("site-packages"))]
    if os.geteuid() == 0:
        python = shutil.which("python3", path="/usr/bin:/bin")  # a python the unprivileged uid can run
        assert python, "a system python3 (Debian python3) is needed to run the worker as another uid"
        prefix, worker = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", python], 65534
    else:
        prefix, worker = [sys.executable], os.geteuid()
    home = tempfile.mkdtemp(prefix="noetl-nonroot-")
    try:
        os.chmod(home, 0o755)
        if os.geteuid() == 0:
            os.chown(home, worker, worker)
        r = subprocess.run([*prefix, "-I", "-c", NON_ROOT, json.dumps(site), home], capture_output=True,
                           text=True, env={"PATH": "/usr/bin:/bin"}, cwd="/", timeout=120)  # fmt: skip
    finally:
        shutil.rmtree(home, ignore_errors=True)
    assert r.returncode == 0, r.stderr[-2000:]
    out = json.loads(r.stdout)
    assert out["uid"] == worker and out["box_uid"] == worker and out["rc"] == 0, out
    lines = out["out"].split()
    assert lines[0] == str(sandbox.sandbox_uid("e1")) and "worker-own-file" not in out["out"], out
    assert lines[-1] == "mine", out


def test_sandbox_false_under_a_sandbox_policy_passes_no_worker_variable(world, monkeypatch):
    monkeypatch.setenv("SOME_API_TOKEN", SECRET)
    task = {"sh": {"kind": "shell", "command": "env", "sandbox": False, "env": {"MINE": "declared"}}}
    res, _ = world.run(_authored(task))
    assert res.status == "completed", res.results
    out = res.results["start"]["stdout"]
    assert "MINE=declared" in out and SECRET not in out and "SOME_API_TOKEN" not in out, out


@pytest.mark.slow  # an MCP server process / a Dagster instance
def test_the_sandbox_holds_under_the_dagster_runner_too(world):
    """The sandbox sits in the tools, which both runners share: an op's python task is confined."""
    import dagster as dg

    from noetl_dagster.resources.noetl import close_all_services
    from noetl_dagster.translator.runner import run_playbook_dagster

    instance = dg.DagsterInstance.ephemeral()
    try:
        res = run_playbook_dagster(load_playbook_dict(_authored({"p": {"kind": "python", "code": _probe_py(world)}})),
                                   event_store=f"sqlite:///{world.data_dir / 'dg.db'}", data_dir=world.data_dir,
                                   instance=instance)  # fmt: skip
    finally:
        instance.dispose()
        close_all_services()
    assert res.status == "completed", res.results
    _assert_confined(res.results["start"])


def test_a_listed_name_that_resolves_to_loopback_is_refused_by_the_proxy(world):
    """allow_hosts lists `localhost:<port>`: the name resolves to 127.0.0.1, which the proxy refuses
    (a name pointing at the worker's own services or a metadata endpoint); the address itself,
    listed as such, is allowed (the other tests)."""
    port = world.allowed.rsplit(":", 1)[1]
    code = (f"import urllib.request as u\ntry:\n    result = u.urlopen('http://localhost:{port}/', timeout=5).read().decode()\n"
            "except Exception as e:\n    result = str(e)")  # fmt: skip
    res, events = world.run(
        _generated({"p": {"kind": "python", "code": code}}, ["python"], hosts=[f"localhost:{port}"])
    )
    assert res.status == "completed", res.results
    out = res.results["start"]["result"]
    assert "403" in out and "hello-from" not in out, res.results
    assert "resolves to 127.0.0.1" in json.dumps([e.data for e in events], default=str)


MANY_PY = """
import os, socket
port = int(os.environ['HTTPS_PROXY'].rsplit(':', 1)[1])
held, opened = [], 0
for _ in range(N):
    s = socket.create_connection(('127.0.0.1', port), timeout=10)
    s.sendall(('CONNECT %s HTTP/1.1\\r\\n\\r\\n' % ALLOWED).encode())
    if s.recv(4096).startswith(b'HTTP/1.1 200'):
        opened += 1
    held.append(s)
result = opened
"""


def test_the_proxy_holds_a_bounded_number_of_connections(world):
    from noetl_dagster.tools.egress import MAX_CONNECTIONS

    code = f"N, ALLOWED = {MAX_CONNECTIONS + 16}, {world.allowed!r}\n" + MANY_PY
    res, events = world.run(
        _generated({"p": {"kind": "python", "code": code}}, ["python"], hosts=[world.allowed])
    )
    assert res.status == "completed", res.results
    assert res.results["start"]["result"] == MAX_CONNECTIONS, res.results
    assert "connections at once" in json.dumps([e.data for e in events], default=str)


def test_sandboxed_code_cannot_redirect_the_workers_script_file(world, tmp_path):
    """The worker (root) writes a `kind: script` file into the scratch folder, which the execution's
    sandboxed code owns: a `.scripts` symlink planted by an earlier task must not make the worker
    write outside it."""
    target = tmp_path / "target"
    target.mkdir()
    plant = {"sh": {"kind": "shell", "command": f"rm -rf .scripts; ln -s {target} .scripts"}}
    run = {"sc": {"kind": "script", "script": {"name": "x.sh", "source": {"code": "echo ran"}}}}
    doc = _authored(plant)
    doc["workflow"][0]["next"] = {"arcs": [{"step": "second"}]}
    doc["workflow"].append({"step": "second", "tool": [run]})
    res, events = world.run(doc)
    assert list(target.iterdir()) == [], list(target.iterdir())
    assert res.status == "failed" and "a symlink?" in json.dumps(res.results), res.results


def test_a_script_name_with_a_path_stays_in_the_scripts_folder(world):
    escaped = {
        "sc": {"kind": "script", "script": {"name": "../../../../escaped.sh", "source": {"code": "echo ran"}}}
    }
    res, _ = world.run(_authored(escaped))
    assert res.status == "completed", res.results
    written = list(world.data_dir.parent.rglob("*escaped.sh"))
    assert written and all(
        p.parent.name == ".scripts" and p.parent.parent.name == "sandbox" for p in written
    ), written


def test_in_worker_tools_do_not_follow_a_link_the_sandboxed_code_planted(world, tmp_path):
    """A generated child's sandboxed python plants symlinks in its scratch folder (inside the execution's
    directory); its DuckDB task (run by the worker, outside the sandbox) opens a file through one: the
    gate's realpath check refuses it."""
    target = tmp_path / "target"
    target.mkdir()
    plant = {"p": {"kind": "python", "code": (
        f"import os\nfor n in ('link.duckdb', 'sandbox'):\n    os.symlink('{target}/' + n, n)\nresult = os.getcwd()")}}  # fmt: skip
    child = _generated(plant, ["python", "duckdb"])["workflow"][0]["tool"][0]["child"]["definition"]
    child["workflow"][1]["next"] = {"arcs": [{"step": "d"}]}
    child["workflow"].append({"step": "d", "tool": [{"d": {"kind": "duckdb", "database": "sandbox/link.duckdb",
                                                           "command": "CREATE TABLE t AS SELECT 1 AS a"}}]})  # fmt: skip
    doc = _generated(plant, ["python", "duckdb"])
    doc["workflow"][0]["tool"][0]["child"]["definition"] = child
    res, _ = world.run(doc)
    assert list(target.iterdir()) == [], list(target.iterdir())
    assert "outside this execution's directory" in json.dumps(res.results), res.results  # the gate's realpath


NS_PY = """
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
out = {}
for name, flag in (('user', 0x10000000), ('mount', 0x00020000), ('net', 0x40000000)):
    pid = os.fork()
    if pid == 0:  # in a child: a namespace that worked must not outlive the probe
        os._exit(0 if libc.unshare(flag) == 0 else 1)
    out[name] = 'CREATED' if os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0 else 'denied'
out['ptrace'] = 'ATTACHED' if libc.ptrace(16, 1, 0, 0) == 0 else 'denied'  # PTRACE_ATTACH to pid 1
result = out
"""


def test_sandboxed_code_cannot_make_namespaces_or_ptrace(world):
    """seccomp (bwrap --seccomp): no nested user namespace (capabilities over a fresh mount namespace:
    kernel attack surface), no other namespace, no ptrace."""
    res, _ = world.run(_generated({"p": {"kind": "python", "code": NS_PY}}, ["python"]))
    assert res.status == "completed", res.results
    out = res.results["start"]
    assert {k: out[k] for k in ("user", "mount", "net", "ptrace")} == dict.fromkeys(
        ("user", "mount", "net", "ptrace"), "denied"
    ), out


@pytest.mark.parametrize("kind", ["python", "shell"])
def test_cpu_time_is_bounded(world, monkeypatch, kind):
    task = ({"p": {"kind": "python", "code": "while True:\n    pass"}} if kind == "python"
            else {"sh": {"kind": "shell", "command": "while :; do :; done"}})  # fmt: skip
    err = _run_limited(world, monkeypatch, task, CPU_SECONDS="1")
    assert err["kind"] != "timeout" and err["message"], err  # ended by SIGXCPU/SIGKILL, not the task timeout
