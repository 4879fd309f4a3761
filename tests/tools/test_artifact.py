"""kind: artifact / result_fetch against the real payload store, and the core fixtures
test_output_select and test_storage_tiers through the engine."""

from __future__ import annotations

import gzip
import os
import textwrap
from pathlib import Path

import pytest

from noetl_dagster.dsl import load_playbook
from noetl_dagster.dsl.kinds import ToolConfigError, get_tool
from noetl_dagster.engine.ports import ToolError
from noetl_dagster.runners.local import run_playbook
from noetl_dagster.tools.artifact import artifact_tool

FIXTURES = Path("/work/shared/conformance/noetl-e2e/fixtures/playbooks")


def test_put_then_get_with_select(make_ctx):
    ctx = make_ctx()
    value = {"status": "ok", "count": 3, "items": [{"id": i, "tags": ["a", "b"]} for i in range(3)]}
    put = artifact_tool({"action": "put", "data": value}, ctx)
    assert put["size_bytes"] > 0 and put["sha256"].startswith("sha256:")
    got = artifact_tool({"result_ref": put["ref"]}, ctx)
    assert got["data"] == value and got["count"] == 3 and got["uri"] == put["uri"] and got["store"] == "file"
    # the bare ref (a step's _ref), a URI, and NoETL's {kind: result_ref, ref}
    assert artifact_tool({"input": {"result_ref": put["ref"]["$ref"]}}, ctx)["data"] == value
    assert artifact_tool({"uri": put["uri"]}, ctx)["data"] == value
    assert artifact_tool({"result_ref": {"kind": "result_ref", "ref": put["uri"]}}, ctx)["data"] == value
    sel = artifact_tool(
        {"result_ref": put["ref"], "select": ["count", "$.items[2].id", "items.1.tags.0"]}, ctx
    )
    assert {k: sel[k] for k in ("count", "id", "0")} == {"count": 3, "id": 2, "0": "a"} and "data" not in sel
    named = artifact_tool({"result_ref": put["ref"], "select": {"n": "count", "first": "$.items[0]"}}, ctx)
    assert named["n"] == 3 and named["first"] == {"id": 0, "tags": ["a", "b"]}


def test_arrow_results_come_back_as_rows(make_ctx):
    from noetl_dagster.tools.duckdb_tool import duckdb_tool

    ctx = make_ctx(inline_limit=1000)
    big = duckdb_tool({"query": "SELECT range AS id, 'x' || range AS name FROM range(5000)"}, ctx)
    assert "$ref" in big["rows"]
    got = artifact_tool({"result_ref": big}, ctx)
    assert len(got["data"]) == 5000 and got["data"][4999] == {"id": 4999, "name": "x4999"}


def test_errors_missing_tampered_and_empty(make_ctx, tmp_path):
    ctx = make_ctx()
    put = artifact_tool({"action": "put", "data": {"a": 1}}, ctx)
    Path(put["uri"].removeprefix("file://")).write_text('{"a": 2}')
    with pytest.raises(ToolError) as ei:
        artifact_tool({"result_ref": put["ref"]}, ctx)
    assert ei.value.kind == "checksum_mismatch"
    with pytest.raises(ToolError) as ei:
        artifact_tool({"uri": put["uri"] + ".missing"}, ctx)
    assert ei.value.kind == "artifact_not_found"
    with pytest.raises(ToolError, match="was the step's result stored inline"):
        artifact_tool({"result_ref": ""}, ctx)


def test_bad_config_is_a_clear_validation_error():
    with pytest.raises(ToolConfigError, match="kind 'artifact': invalid config: action"):
        get_tool("artifact").check_config({"action": "delete"})
    assert get_tool("result_fetch").fn is artifact_tool


@pytest.mark.parametrize("name", ["test_output_select", "test_storage_tiers"])
def test_core_fixtures_run(name, tmp_path):
    res = run_playbook(load_playbook(str(FIXTURES / f"{name}.yaml")), data_dir=tmp_path)
    assert res.status == "completed", res
    if name == "test_output_select":
        assert res.results["verify_extracted_fields"]["was_externalized"] is True
        assert res.results["process_full_data"]["total_items"] == 1000
        assert res.results["summary"]["test_result"] == "PASSED"
    else:
        final = res.results["final_summary"]
        assert final["lazy_loading"] == "PASSED"  # 500, 2000, 5000 items read back
        tiers = final["tier_details"]
        # we have no NATS KV tier: the 100 KB result goes to the disk (file) store like the bigger ones
        assert tiers["inline"]["correct"] and tiers["disk"]["correct"] and tiers["large_storage"]["correct"]
        assert tiers["nats_kv"]["store"] == "disk" and not tiers["nats_kv"]["correct"]


@pytest.mark.slow
def test_output_select_fixture_gives_the_same_trace_under_dagster(tmp_path, monkeypatch):
    """The offload -> _ref -> artifact path through a real Dagster run (execute_in_process) and the local
    runner: same results, same event names in the same order."""
    import dagster as dg

    from noetl_dagster.resources.noetl import close_all_services
    from noetl_dagster.storage.event_stores import open_event_store
    from noetl_dagster.translator.runner import run_playbook_dagster

    monkeypatch.setenv("NOETL_DAGSTER_HOME", str(tmp_path / "home"))
    pb = load_playbook(str(FIXTURES / "test_output_select.yaml"))
    local = run_playbook(pb, data_dir=tmp_path / "local")
    url = f"sqlite:///{tmp_path / 'events.db'}"
    instance = dg.DagsterInstance.ephemeral()
    try:
        dag = run_playbook_dagster(pb, event_store=url, data_dir=tmp_path / "home", instance=instance)
    finally:
        instance.dispose()
        close_all_services()
    assert dag.status == local.status == "completed"
    assert dag.results["summary"] == local.results["summary"]

    def names(store_url, execution_id):
        store = open_event_store(store_url)
        try:
            return [e.name for e in store.read(execution_id)]
        finally:
            store.close()

    dag_names = names(url, dag.execution_id)
    assert dag_names and dag_names == names(
        f"sqlite:///{tmp_path / 'local' / 'events.db'}", local.execution_id
    )


# -- put/get honour `uri`, confined to NOETL_ARTIFACT_ROOTS (issue 32.1) ----------------------------


def _read_back(path: Path) -> object:
    import json

    return json.loads(path.read_text())


def test_put_writes_at_its_uri_and_get_reads_it(make_ctx, tmp_path, monkeypatch):
    r1, r2 = tmp_path / "r1", tmp_path / "r2"
    r1.mkdir(), r2.mkdir()
    monkeypatch.setenv("NOETL_ARTIFACT_ROOTS", f"{r1}{os.pathsep}{r2}")
    ctx = make_ctx()
    value = {"rows": [1, 2, 3]}
    # file:// in the second root, a plain absolute path, a relative path (to the first root), artifact://localfs
    for uri, where in [((r2 / "a" / "x.json").as_uri(), r2 / "a" / "x.json"),
                       (str(r1 / "y.json"), r1 / "y.json"),
                       ("sub/z.json", r1 / "sub" / "z.json"),
                       (f"artifact://localfs{r2}/w.json", r2 / "w.json")]:  # fmt: skip
        put = artifact_tool({"action": "put", "uri": uri, "data": value}, ctx)
        assert put["path"] == str(where) and _read_back(where) == value
        assert artifact_tool({"uri": uri}, ctx)["data"] == value
        assert artifact_tool({"result_ref": put["ref"]}, ctx)["rows"] == [1, 2, 3]  # checksum-verified
    assert not (ctx.data_dir / "payloads").exists() or not any((ctx.data_dir / "payloads").rglob("*.json"))
    # text stays text, compress gzips and appends .gz as upstream does
    artifact_tool({"action": "put", "uri": str(r1 / "note.txt"), "data": "hello"}, ctx)
    assert (r1 / "note.txt").read_text() == "hello"
    put = artifact_tool({"action": "put", "uri": str(r1 / "c.json"), "data": value, "compress": True}, ctx)
    assert (
        put["path"] == str(r1 / "c.json.gz")
        and gzip.decompress((r1 / "c.json.gz").read_bytes()) == b'{"rows":[1,2,3]}'
    )
    assert artifact_tool({"uri": str(r1 / "c.json.gz")}, ctx)["data"] == value


def test_default_root_is_the_data_dir(make_ctx, tmp_path, monkeypatch):
    monkeypatch.delenv("NOETL_ARTIFACT_ROOTS", raising=False)
    ctx = make_ctx()
    artifact_tool({"action": "put", "uri": "out/v.json", "data": [1]}, ctx)
    assert _read_back(ctx.data_dir / "out" / "v.json") == [1]
    with pytest.raises(ToolError, match="NOETL_ARTIFACT_ROOTS") as ei:
        artifact_tool({"action": "put", "uri": str(tmp_path / "elsewhere.json"), "data": [1]}, ctx)
    assert ei.value.kind == "config_error" and not (tmp_path / "elsewhere.json").exists()


@pytest.mark.parametrize("action", ["put", "get"])
def test_outside_dotdot_and_symlink_escapes_are_config_errors(make_ctx, tmp_path, monkeypatch, action):
    root, outside = tmp_path / "root", tmp_path / "outside"
    root.mkdir(), outside.mkdir()
    (outside / "secret.json").write_text('{"s": 1}')
    (root / "link").symlink_to(outside, target_is_directory=True)  # a directory link leading out
    (root / "file_link.json").symlink_to(outside / "secret.json")  # a file link leading out
    (root / "inner").mkdir()
    (root / "ok_link").symlink_to(root / "inner", target_is_directory=True)  # a link that stays inside
    monkeypatch.setenv("NOETL_ARTIFACT_ROOTS", str(root))
    ctx = make_ctx()
    before = sorted(p.name for p in outside.iterdir())
    for uri in [str(outside / "secret.json"), (outside / "secret.json").as_uri(), "../outside/secret.json",
                f"{root}/inner/../../outside/secret.json", "link/secret.json", str(root / "link" / "new.json"),
                "file_link.json", f"artifact://localfs{outside}/secret.json", "~/x.json"]:  # fmt: skip
        cfg = {"action": action, "uri": uri, "data": {"x": 1}} if action == "put" else {"uri": uri}
        with pytest.raises(ToolError) as ei:
            artifact_tool(cfg, ctx)
        assert ei.value.kind == "config_error", (uri, ei.value)
        msg = str(ei.value.message)
        assert "\n" not in msg and "NOETL_ARTIFACT_ROOTS" in msg and "outside the artifact roots" in msg, msg
    assert (
        sorted(p.name for p in outside.iterdir()) == before
        and (outside / "secret.json").read_text() == '{"s": 1}'
    )
    # a link that stays inside a root is fine
    if action == "put":
        artifact_tool({"action": "put", "uri": "ok_link/v.json", "data": {"v": 2}}, ctx)
        assert _read_back(root / "inner" / "v.json") == {"v": 2}
    else:
        (root / "inner" / "g.json").write_text('{"g": 3}')
        assert artifact_tool({"uri": "ok_link/g.json"}, ctx)["g"] == 3


def test_other_schemes_and_the_payload_store_own_uris(make_ctx, tmp_path, monkeypatch):
    monkeypatch.setenv("NOETL_ARTIFACT_ROOTS", str(tmp_path / "nowhere"))  # the store is not under a root
    ctx = make_ctx()
    for cfg in ({"action": "put", "uri": "gs://b/k.json", "data": 1}, {"uri": "gs://b/k.json"}):
        with pytest.raises(ToolError, match="neither a local path nor this execution's payload store") as ei:
            artifact_tool(cfg, ctx)
        assert ei.value.kind == "config_error"
    # the payload store's own URIs go through the store (its own root check), under any roots
    put = artifact_tool({"action": "put", "data": {"a": 1}}, ctx)
    assert artifact_tool({"uri": put["uri"]}, ctx)["a"] == 1
    target = ctx.payload_store.uri_for("manual/data.json")
    put2 = artifact_tool({"action": "put", "uri": target, "data": {"b": 2}}, ctx)
    assert put2["uri"] == target and ctx.payload_store.get_bytes(target) == b'{"b":2}'
    assert artifact_tool({"result_ref": put2["ref"]}, ctx)["b"] == 2


def test_playbook_put_and_get_through_the_cli(tmp_path):
    import json
    import subprocess
    import sys

    root = tmp_path / "root"
    pb = tmp_path / "art.yaml"
    pb.write_text(
        textwrap.dedent("""\
        apiVersion: noetl.io/v2
        kind: Playbook
        metadata: {name: art, path: tests/art}
        workload: {target: "file:///nowhere/x.json"}
        workflow:
          - step: start
            tool: {kind: artifact, action: put, uri: "{{ workload.target }}", data: {rows: [1, 2, 3]}}
            next: {arcs: [{step: get}]}
          - step: get
            tool: {kind: artifact, action: get, uri: "{{ workload.target }}"}
    """)
    )
    env = {**os.environ, "NOETL_DAGSTER_HOME": str(tmp_path / "home"), "NOETL_ARTIFACT_ROOTS": str(root)}

    def run(target: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "noetl_dagster.commands.main", "validate", str(pb)],
                              capture_output=True, text=True, env=env, check=True) and subprocess.run(
            [sys.executable, "-m", "noetl_dagster.commands.main", "run", str(pb), "--json", "--workload",
             json.dumps({"target": target})], capture_output=True, text=True, env=env, timeout=120)  # fmt: skip

    ok = run((root / "d" / "x.json").as_uri())
    out = json.loads(ok.stdout)
    assert ok.returncode == 0 and out["status"] == "completed", ok.stderr
    assert json.loads((root / "d" / "x.json").read_text()) == {"rows": [1, 2, 3]}
    assert out["results"]["get"]["rows"] == [1, 2, 3]
    bad = run(str(tmp_path / "outside.json"))
    out = json.loads(bad.stdout)
    assert bad.returncode == 1 and out["status"] == "failed"
    err = out["results"]["start"]["error"]
    assert err["kind"] == "config_error" and "NOETL_ARTIFACT_ROOTS" in err["message"]
    assert not (tmp_path / "outside.json").exists()


def test_a_generated_playbook_reaches_only_its_own_directory(tmp_path, monkeypatch):
    from noetl_dagster.dsl import load_playbook_dict

    outside = tmp_path / "outside"
    outside.mkdir()
    monkeypatch.setenv("NOETL_DAGSTER_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("NOETL_ARTIFACT_ROOTS", str(tmp_path))  # the parent's roots are not the child's

    def child(uri: str) -> dict:
        return {"apiVersion": "noetl.io/v2", "kind": "Playbook", "metadata": {"name": "gen", "path": "gen/art"},
                "workflow": [{"step": "start", "tool": [{"w": {"kind": "artifact", "action": "put", "uri": uri,
                                                               "data": {"a": 1}}}]}]}  # fmt: skip

    def run(uri: str):
        doc = {
            "apiVersion": "noetl.io/v2",
            "kind": "Playbook",
            "metadata": {"name": "p", "path": "tests/p"},
            "executor": {"spec": {"generated": {"allow_kinds": ["artifact"]}}},
            "workflow": [
                {"step": "run_child", "tool": [{"c": {"kind": "playbook", "definition": child(uri)}}]}
            ],
        }
        return run_playbook(load_playbook_dict(doc), event_store=f"sqlite:///{tmp_path / 'ev.db'}",
                            data_dir=tmp_path / "home")  # fmt: skip

    ok = run("mine/a.json")  # relative: the child's own directory
    assert ok.status == "completed", ok.results
    assert list((tmp_path / "home").rglob("mine/a.json"))
    for uri in [str(outside / "a.json"), (outside / "a.json").as_uri(), f"artifact://localfs{outside}/a.json",
                "../../../outside/a.json"]:  # fmt: skip
        res = run(uri)
        assert res.status == "failed", (uri, res.results)
        assert "outside" in json_text(res.results["run_child"]), res.results
    assert list(outside.iterdir()) == []


def json_text(value: object) -> str:
    import json

    return json.dumps(value, default=str)


def test_a_generated_playbook_touches_payloads_of_its_own_tenant_only(tmp_path, monkeypatch, s3_bucket):
    """With an object-store payload store (S3 on moto) the store's URIs name every tenant's results:
    a generated playbook of acme read globex's payload by its URI and wrote into globex's prefix."""
    from noetl_dagster.dsl import load_playbook_dict
    from noetl_dagster.storage.payload import PayloadNotFound, open_payload_store

    endpoint, bucket, _ = s3_bucket
    url = f"s3://{bucket}/pre?endpoint_url={endpoint}&key=testing&secret=testing"
    monkeypatch.setenv("NOETL_PAYLOAD_STORE_URL", url)
    store = open_payload_store(url)
    foreign = store.put_bytes(
        "globex/default/01900000-0000-7000-8000-000000000000/start/s-1.json", b'{"pii": 1}'
    )
    planted = foreign.replace("s-1.json", "planted.json")

    def run(tasks: list) -> object:
        child = {"apiVersion": "noetl.io/v2", "kind": "Playbook", "metadata": {"name": "gen", "path": "gen/art"},
                 "workflow": [{"step": "start", "tool": tasks}]}  # fmt: skip
        doc = {"apiVersion": "noetl.io/v2", "kind": "Playbook", "metadata": {"name": "p", "path": "tests/p"},
               "executor": {"spec": {"generated": {"allow_kinds": ["artifact"]}}},
               "workflow": [{"step": "run_child", "tool": [{"c": {"kind": "playbook", "definition": child}}]}]}  # fmt: skip
        return run_playbook(load_playbook_dict(doc), event_store=f"sqlite:///{tmp_path / 'ev.db'}",
                            data_dir=tmp_path / "home", tenant="acme")  # fmt: skip

    for task in ({"kind": "artifact", "uri": foreign},
                 {"kind": "artifact", "result_ref": {"kind": "result_ref", "ref": foreign}},
                 {"kind": "artifact", "action": "put", "uri": planted, "data": {"owned": True}}):  # fmt: skip
        res = run([{"t": task}])
        assert res.status == "failed", (task, res.results)
        text = json_text(res.results["run_child"])
        assert "own tenant and project only" in text and '"pii"' not in text, res.results
    dotdot = run(
        [{"t": {"kind": "artifact", "uri": foreign.replace("globex/", "acme/default/../../globex/")}}]
    )
    assert dotdot.status == "failed" and '"pii"' not in json_text(dotdot.results)
    with pytest.raises(PayloadNotFound):
        store.get_bytes(planted)
    # its own payloads stay reachable: a put without uri lands beside the execution's results
    own = run([{"w": {"kind": "artifact", "action": "put", "data": {"a": 1}}},
               {"r": {"kind": "artifact", "uri": "{{ w.uri }}"}}])  # fmt: skip
    assert own.status == "completed", own.results
    assert "/acme/default/" in json_text(own.results)
