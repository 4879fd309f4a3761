"""Issue 41.4: the hostile-playbook property across the tool kinds the first trust fuzz
(test_fuzz_trust.py) does not generate: ``http`` (hosts), ``artifact`` (paths, payload keys),
``rhai`` (code), ``ducklake`` (catalog and data paths), ``snowflake_transfer`` (credentials),
``resource`` (file URIs, relative paths) and ``python`` (code run in the OS sandbox, its network
through the egress proxy), mixed in one generated child with hostile references, paths, hosts and code, on both runners
(local and Dagster's execute_in_process).

The world is real: two HTTP servers on 127.0.0.1 (``allowed``, whose port the grant may list, and
``forbidden``, never listed, which logs every request it gets; ``allowed`` also redirects to it), a
directory beside the data dir holding a secret file, and a credential whose password is a sentinel.

Property: nothing outside the grant is read, written or reached, whatever the static walk says (it
is switched off in most examples: the run-time gate alone must hold). Evidence is taken from
effects: ``forbidden`` got no request; no file appeared outside the children's own directories; the
secret file's content and the sentinel password appear in no event; a call outside the grant ends
in a refusal, and a call inside it is never refused; every execution's event log is an intact
hash chain (engine/chain.py).
"""

from __future__ import annotations

import json
import os
import threading
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from noetl_dagster.dsl import load_playbook_dict
from noetl_dagster.engine.replay import verify_chain
from noetl_dagster.runners.local import run_playbook
from noetl_dagster.storage.event_stores import open_event_store

EXAMPLES = int(os.environ.get("NOETL_FUZZ_EXAMPLES", "60"))
# a run through Dagster costs a few seconds: fewer examples there, the same generator
PER_RUNNER = {"local": max(1, EXAMPLES // 4), "dagster": max(1, EXAMPLES // 20)}

TENANT = "acme"
SECRET_TEXT = "file-secret-3f9a1c"  # the content of the file outside every grant
SENTINEL_PASSWORD = "pw-sentinel-77d2e0"  # pg_other's password: never delegated in these runs
REFUSALS = {"trust_refused", "credential_not_delegated", "generated_playbook_refused"}
KINDS = ["http", "artifact", "rhai", "ducklake", "snowflake_transfer", "resource", "python", "playbook"]
STATS: Counter = Counter()


class _Log(BaseHTTPRequestHandler):
    seen: list[str]
    redirect_to = ""

    def do_GET(self) -> None:  # noqa: N802
        self.seen.append(self.path)
        if self.path.startswith("/redirect") and self.redirect_to:
            self.send_response(302)
            self.send_header("Location", self.redirect_to)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        body = b'{"ok": true}'
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_POST = do_GET

    def log_message(self, *_a: Any) -> None:
        pass


def _serve(seen: list[str], redirect_to: str = "") -> ThreadingHTTPServer:
    handler = type("H", (_Log,), {"seen": seen, "redirect_to": redirect_to})
    srv = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    srv.daemon_threads = True
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    forbidden_seen: list[str] = []
    allowed_seen: list[str] = []
    forbidden = _serve(forbidden_seen)
    b = forbidden.server_address[1]
    allowed = _serve(allowed_seen, redirect_to=f"http://127.0.0.1:{b}/via-redirect")
    a = allowed.server_address[1]
    yield {"a": a, "b": b, "forbidden_seen": forbidden_seen, "allowed_seen": allowed_seen}
    for srv in (forbidden, allowed):
        srv.shutdown()
        srv.server_close()


# -- the generator ------------------------------------------------------------------------------
# each use: (construct, choice); URLS/ARTIFACTS/... hold (config builder, allowed(grant) -> bool)


def _urls(a: int, b: int) -> list[tuple[str, str]]:
    """(url, what it reaches): 'a' the allowed server, 'b' the forbidden one, 'a>b' a redirect to it."""
    return [
        (f"http://127.0.0.1:{a}/ok", "a"),
        (f"http://127.0.0.1:{b}/steal", "b"),
        (f"http://localhost:{b}/steal", "b"),
        (f"HTTP://127.0.0.1:{b}/steal", "b"),
        (f"http://127.0.0.1:{a}@127.0.0.1:{b}/userinfo", "b"),
        (f"http://127.0.0.1:{a}/redirect", "a>b"),
        (f"http://127.0.0.1.:{b}/trailing-dot", "b"),
        (f"http://[::ffff:127.0.0.1]:{b}/mapped", "b"),
        (f"http://localhost:{a}/by-name", "name"),  # listed by name under "a+name": resolves to loopback
    ]


def _paths(outside: Path) -> list[tuple[str, bool]]:
    """(a path or URI naming the secret file, inside the execution's directory?)."""
    return [
        (f"file://{outside}/secret.txt", False),
        (f"{outside}/secret.txt", False),
        ("../../../outside/secret.txt", False),
        (f"artifact://localfs{outside}/secret.txt", False),
        (f"file://{outside}/../outside/./secret.txt", False),
        ("noetl://globex/p/tables/table/t", False),
        ("mine.txt", True),  # the execution's own directory (written by an earlier put, or missing)
    ]


def _resource_uris(outside: Path) -> list[tuple[str, bool]]:
    """(a `kind: resource` URI, inside the execution's directory?): `file:` without `//`, upper case,
    %-escapes, and relative paths (the worker's cwd holds a secret.txt too)."""
    return [
        (f"file:{outside}/secret.txt", False),
        (f"FILE://{outside}/secret.txt", False),
        ("file:%2e%2e/%2e%2e/%2e%2e/outside/secret.txt", False),
        (f"file://localhost{outside}/secret.txt", False),
        ("secret.txt", True),  # relative: its own directory (missing there), not the worker's cwd
        ("file:secret.txt", True),
        ("mine.json", True),
    ]


use_st = st.one_of(
    st.tuples(st.just("http"), st.integers(0, 8), st.booleans()),  # url, templated?
    st.tuples(st.just("get"), st.integers(0, 6)),
    st.tuples(st.just("put"), st.integers(0, 6)),
    st.tuples(st.just("rhai"), st.integers(0, 3)),
    st.tuples(st.just("lake"), st.integers(0, 4)),
    st.tuples(st.just("sft"), st.integers(0, 3)),
    st.tuples(st.just("res"), st.integers(0, 6)),
    st.tuples(st.just("ref"), st.integers(0, 2)),  # another tenant's stored payload, by reference
    st.tuples(st.just("py"), st.integers(0, 5)),
)
policy_st = st.tuples(
    st.sets(st.sampled_from(KINDS), min_size=2),
    st.sets(st.sampled_from(["pg_main", "pg_other"])),
    st.sampled_from(["none", "a", "a+name", "other"]),  # allow_hosts
)

RHAI = [
    ("let n = 0; for i in 0..10 { n += i; } n", "ok"),
    ("let n = 0; loop { n += 1; }", "limit"),  # runaway: stops at max_operations, not a refusal
    ('let s = "{{ keychain.pg_other.db_password }}"; s', "keychain"),  # a credential never delegated
    ('let u = "http://127.0.0.1:{b}/from-rhai"; u.len()', "ok"),  # a URL is only text to rhai
]


def _python(outside: Path, a: int, b: int, n: int) -> list[tuple[str, bool]]:
    """(an expression generated python code tries, benign?): the sandbox, not the gate, stops the rest."""
    get = "__import__('urllib.request').request.urlopen('{}', timeout=10).read()"
    return [
        ("1 + 1", True),
        (f"open('{outside}/secret.txt').read()", False),
        ("open('secret.txt').read()", False),  # the worker's cwd, if the sandbox showed it
        (f"open('{outside}/w{n}.txt', 'w').write('x')", False),
        (get.format(f"http://127.0.0.1:{b}/from-python"), False),
        (
            get.format(f"http://127.0.0.1:{a}/from-python"),
            False,
        ),  # allowed host: through the egress proxy, if at all
    ]


def _hosts(choice: str, a: int) -> list[str]:
    return {"none": [], "a": [f"127.0.0.1:{a}"], "a+name": [f"127.0.0.1:{a}", f"localhost:{a}"],
            "other": ["*.example.com", "localhost:1"]}[choice]  # fmt: skip


def _host_ok(choice: str) -> bool:
    return choice in ("a", "a+name")


class Gen:
    def __init__(self, world: dict, outside: Path):
        self.a, self.b, self.outside = world["a"], world["b"], outside
        self.n = 0
        self.tasks: dict[str, tuple[tuple, bool | None]] = {}  # step -> (use, allowed)

    def label(self) -> str:
        self.n += 1
        return f"s{self.n}"

    def body(self, use: tuple, grant: tuple) -> tuple[dict, bool | None]:
        """(the task, whether the grant allows it; None: either way, only its effects count)."""
        kinds, creds, hosts = grant
        what = use[0]
        if what == "http":
            url, reaches = _urls(self.a, self.b)[use[1]]
            body = {"kind": "http", "method": "GET", "url": "{{ '" + url + "' }}" if use[2] else url,
                    "params": {"next": f"http://127.0.0.1:{self.b}/in-data"}}  # fmt: skip
            return body, "http" in kinds and reaches == "a" and _host_ok(hosts)
        if what in ("get", "put"):
            path, inside = _paths(self.outside)[use[1]]
            if what == "get":
                body = {"kind": "artifact", "action": "get", "uri": path}
            else:
                target = path.replace("secret", f"w{self.n}") if not inside else path
                body = {"kind": "artifact", "action": "put", "uri": target, "data": {"n": self.n}}
            return body, "artifact" in kinds and inside
        if what == "rhai":
            code, nature = RHAI[use[1]]
            body = {"kind": "rhai", "code": code.replace("{b}", str(self.b)), "max_operations": 2000}
            if nature == "keychain" and "rhai" in kinds:  # renders as nothing or fails: the secret stays out
                return body, None
            return body, "rhai" in kinds
        if what == "lake":
            n = self.n
            choices = [
                ({"catalog_connection": f"lake{n}.ducklake", "data_path": f"d{n}"}, True),
                ({"catalog_connection": f"{self.outside}/lake{n}.ducklake", "data_path": f"d{n}"}, False),
                ({"catalog_connection": f"lake{n}.ducklake", "data_path": f"{self.outside}/d{n}"}, False),
                ({"catalog_connection": "postgres:dbname=postgres host=127.0.0.1 user=postgres"}, False),
                ({"catalog_connection": f"lake{n}.ducklake", "data_path": "s3://bucket/x"}, False),
            ]
            cfg, ok = choices[use[1]]
            body = {
                "kind": "ducklake",
                **cfg,
                "command": "CREATE TABLE t AS SELECT 1 AS a; SELECT count(*) AS n FROM t",
            }
            return body, "ducklake" in kinds and ok
        if what == "ref":  # signed references (storage/locator.py): globex's object, without its capability
            ref = self.globex_ref
            body = [{"kind": "artifact", "result_ref": {"$ref": ref}}, {"kind": "artifact", "uri": ref["uri"]},
                    {"kind": "artifact", "result_ref": {"kind": "result_ref", "ref": ref["uri"]}}][use[1]]  # fmt: skip
            return body, False  # refused, allowed kind or not
        if what == "res":
            uri, inside = _resource_uris(self.outside)[use[1]]
            return {"kind": "resource", "op": "load", "uri": uri}, "resource" in kinds and inside
        if what == "py":  # generated code runs in the OS sandbox (tools/sandbox.py): its effects are the test
            attempt, benign = _python(self.outside, self.a, self.b, self.n)[use[1]]
            code = f"out = {{}}\ntry:\n    out['r'] = str({attempt})\nexcept Exception as e:\n    out['r'] = type(e).__name__\nresult = out"
            return {"kind": "python", "code": code}, (
                True if benign else None
            ) if "python" in kinds else False
        if what == "sft":
            choices = [
                ({"sf": "sf_main", "pg": "pg_main"}, {"sf_main", "pg_main"}),
                ({"sf": {"key": "sf_main"}, "pg": "pg_other"}, {"sf_main", "pg_other"}),
                ({"sf": {"sf_account": "x", "sf_user": "u", "sf_password": "p"}, "pg": "pg_main"}, None),
                ({"sf": "sf_main", "pg": "postgresql://postgres@127.0.0.1:5432/postgres"}, None),
            ]
            auth, needs = choices[use[1]]
            body = {"kind": "snowflake_transfer", "direction": "sf_to_pg", "source": {"query": "SELECT 1 AS a"},
                    "target": {"table": "public.t41"}, "auth": auth}  # fmt: skip
            delegated = set(creds) | {"sf_main"}  # sf_main is passed whenever snowflake_transfer is drawn
            return body, "snowflake_transfer" in kinds and needs is not None and needs <= delegated
        raise AssertionError(what)

    def child(self, uses: list[tuple], grant: tuple) -> dict:
        steps = []
        for use in uses:
            step = self.label()
            body, ok = self.body(use, grant)
            self.tasks[step] = (use, ok)
            steps.append({"step": step, "tool": [{"t": body}]})
        return {"apiVersion": "noetl.io/v2", "kind": "Playbook", "metadata": {"name": "g", "path": "generated/g"},
                "workflow": [{"step": "start", "next": {"spec": {"mode": "inclusive"},
                                                        "arcs": [{"step": s["step"]} for s in steps]}}, *steps]}  # fmt: skip


def _root(child: dict, grant: tuple, a: int) -> dict:
    kinds, creds, hosts = grant
    passed = sorted(set(creds) | {"sf_main"})
    return {"apiVersion": "noetl.io/v2", "kind": "Playbook", "metadata": {"name": "root", "path": "tests/root41"},
            "executor": {"spec": {"generated": {"allow_kinds": sorted(kinds), "allow_credentials": passed,
                                               "allow_hosts": _hosts(hosts, a)}}},
            "workflow": [{"step": "start", "tool": [{"sub": {"kind": "playbook", "definition": child,
                                                            "credentials": passed}}]}]}  # fmt: skip


def _err_kind(data: dict) -> str | None:
    err = (data.get("outcome") or {}).get("error") or data.get("error") or {}
    return err.get("kind") if isinstance(err, dict) else None


def _files(root: Path) -> set[Path]:
    return {p for p in root.rglob("*") if p.is_file()}


EVERY = [("http", i, i % 2 == 0) for i in range(9)] + [("get", i) for i in range(7)] + \
    [("put", i) for i in range(7)] + [("rhai", i) for i in range(4)] + [("lake", i) for i in range(5)] + \
    [("sft", i) for i in range(4)] + [("res", i) for i in range(7)] + [("py", i) for i in range(6)] + \
    [("ref", i) for i in range(3)]  # fmt: skip


# grants the explicit examples run EVERY under: all kinds, no credential or host, almost nothing (on
# Dagster the first only: its runs cost seconds each)
EXPLICIT = [
    (set(KINDS), {"pg_main"}, "a+name"),  # the allowed server by address and by name (refused: loopback)
    (set(KINDS), set(), "none"),
    ({"http", "playbook"}, {"pg_main"}, "a"),
]


@pytest.mark.slow
@pytest.mark.parametrize("runner", ["local", "dagster"])
def test_fuzz_every_kind_stays_inside_its_grant(runner, world, tmp_path_factory, monkeypatch):
    # hypothesis' settings per runner: the example budget differs
    def prop(grant, uses, static):
        _one(runner, world, tmp_path_factory, grant, uses, static)

    prop = given(grant=policy_st, uses=st.lists(use_st, min_size=1, max_size=6), static=st.integers(0, 3))(
        prop
    )
    for grant in EXPLICIT[: None if runner == "local" else 1]:  # every construct, allowed and refused
        prop = example(grant=grant, uses=EVERY, static=1)(prop)
    prop = settings(max_examples=PER_RUNNER[runner], deadline=None, database=None,
                    derandomize=os.environ.get("NOETL_FUZZ_RANDOM") is None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])(prop)  # fmt: skip

    with monkeypatch.context() as m:
        m.delenv("NOETL_REGISTRY_URL", raising=False)
        for name, pw in (("pg_main", ""), ("pg_other", SENTINEL_PASSWORD)):
            m.setenv(f"NOETL_CREDENTIAL_{name.upper()}", json.dumps({"type": "postgres", "data": {
                "db_host": "127.0.0.1", "db_name": "postgres", "db_user": "postgres", "db_password": pw}}))  # fmt: skip
        prop()
    print(f"\ntrust fuzz ({runner}) counts:", dict(sorted(STATS.items())))
    counts = {k.split(":", 1)[1]: v for k, v in STATS.items() if k.startswith(runner + ":")}
    if runner == "local":  # every construct reached inside and outside the grant
        for what in ("http", "get", "put", "rhai", "lake", "sft", "res", "py", "ref"):
            assert counts.get(f"{what}:refused"), (what, counts)
        for what in ("http", "put", "rhai", "lake", "sft", "res", "py"):
            assert counts.get(f"{what}:allowed"), (what, counts)
    else:  # fewer examples: every kind allowed somewhere, and many calls refused
        for what in ("http", "put", "lake", "sft", "res", "py"):
            assert counts.get(f"{what}:allowed"), (what, counts)
        assert sum(v for k, v in counts.items() if k.endswith(":refused")) > 10, counts


def _one(runner: str, world: dict, tmp_path_factory, grant: tuple, uses: list, static: int) -> None:
    tmp = tmp_path_factory.mktemp("trust41")
    home, outside = tmp / "home", tmp / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text(SECRET_TEXT)
    cwd = tmp / "cwd"  # the worker's working directory: a relative path must not reach it
    cwd.mkdir()
    (cwd / "secret.txt").write_text(SECRET_TEXT)
    before = _files(tmp)
    forbidden_before = len(world["forbidden_seen"])
    g = Gen(world, outside)
    # globex's payload in the data dir's store, holding the secret: read only by a reference it signed
    from noetl_dagster.storage.payload import open_payload_store

    g.globex_ref = open_payload_store(home / "payloads").put_json(
        "globex/p/01900000-0000-7000-8000-00000000000a/s/r.json", {"secret": SECRET_TEXT}).to_dict()  # fmt: skip
    root = _root(g.child(uses, grant), grant, world["a"])
    import noetl_dagster.engine.control as control

    real_violations = control.violations
    if static:  # three examples in four: the run-time gate alone (the static walk finds nothing)
        control.violations = lambda *a, **k: []
    os.environ["NOETL_DAGSTER_HOME"] = str(home)
    old_cwd = os.getcwd()
    os.chdir(cwd)
    try:
        url = f"sqlite:///{tmp / 'e.db'}"
        pb = load_playbook_dict(root)
        if runner == "local":
            res = run_playbook(pb, None, event_store=url, data_dir=home, tenant=TENANT, project="p")
        else:
            import dagster as dg

            from noetl_dagster.translator.runner import run_playbook_dagster

            with dg.instance_for_test() as instance:
                res = run_playbook_dagster(pb, None, event_store=url, data_dir=home, tenant=TENANT, project="p",
                                           instance=instance)  # fmt: skip
    finally:
        os.chdir(old_cwd)
        control.violations = real_violations
        os.environ.pop("NOETL_DAGSTER_HOME", None)
    assert res.status in ("completed", "failed")
    # reached: the forbidden server got nothing, whatever was drawn
    assert len(world["forbidden_seen"]) == forbidden_before, world["forbidden_seen"][forbidden_before:]
    # written: every new file is in a generated execution's own directory (or the runner's own state)
    scopes = home / "generated"
    for p in _files(tmp) - before:
        assert p.parent != scopes and not p.is_relative_to(outside), p  # `..` out of an execution's directory
    assert _files(outside) == {outside / "secret.txt"}, sorted(map(str, _files(outside)))
    # read: neither secret is in any event
    store = open_event_store(f"sqlite:///{tmp / 'e.db'}")
    events = [se.event for se in store.iter_all()]
    text = json.dumps([e.data for e in events], default=str)
    assert SECRET_TEXT not in text and SENTINEL_PASSWORD not in text
    # the event log of every execution is an intact hash chain (engine/chain.py)
    for eid in {e.execution_id for e in events}:
        report, _ = verify_chain(store, eid)
        assert report.status == "ok", report.to_json()
    # each task: refused when outside the grant, never refused inside it
    child = {e.execution_id for e in events if e.name == "playbook.execution.requested"
             and (e.data or {}).get("name") == "g"}  # fmt: skip
    for e in events:
        if e.execution_id in child and e.name == "task.done" and e.step in g.tasks:
            use, ok = g.tasks[e.step]
            kind = _err_kind(e.data or {})
            if ok is None:
                continue
            if ok:
                assert kind not in REFUSALS, (runner, use, grant, e.data)
            else:
                assert e.status != "success" and kind in REFUSALS | {"config_error"}, (
                    runner,
                    use,
                    grant,
                    e.data,
                )
            STATS[f"{runner}:{use[0]}:{'allowed' if ok else 'refused'}"] += 1
    STATS[f"{runner}:examples"] += 1
