"""Generated (inline) playbooks: `kind: playbook` with a `definition`, their identity and trust boundary.

Real executions on a SQLite event store; no stubs. A generated child runs as its
own execution (own events, replayable), is identified by the sha256 of its
canonical YAML, and gets only the tool kinds and credentials its parent's
`executor.spec.generated` allows and its call passes.
"""

from __future__ import annotations

import json
import textwrap

import pytest
import yaml

from noetl_dagster.dsl import load_playbook_dict
from noetl_dagster.dsl.builder import canonical_yaml, playbook, playbook_id, python, subplaybook
from noetl_dagster.engine.replay import replay
from noetl_dagster.runners.local import run_playbook
from noetl_dagster.storage.event_stores import open_event_store

SECRET = "pg-Pa55word-never-in-events"

CHILD = {
    "apiVersion": "noetl.io/v2",
    "kind": "Playbook",
    "metadata": {"name": "generated_sum", "path": "generated/sum"},
    "workload": {"a": 1, "b": 2},
    "workflow": [
        {"step": "start", "next": {"arcs": [{"step": "add"}]}},
        {"step": "add", "tool": [{"calc": {"kind": "python", "input": {"a": "{{ workload.a }}", "b": "{{ workload.b }}"},
                                            "code": "def main(a, b):\n    return {'sum': a + b}\n"}}]},
    ],
}  # fmt: skip


def parent_doc(
    tool_body: dict, *, generated: dict | None = None, before: list | None = None, keychain=None
) -> dict:
    doc = {
        "apiVersion": "noetl.io/v2",
        "kind": "Playbook",
        "metadata": {"name": "parent", "path": "tests/parent"},
        "workflow": [
            *(before or []),
            {"step": "run_child", "tool": [{"child": {"kind": "playbook", **tool_body}}]},
        ],
    }
    if generated is not None:
        doc["executor"] = {"spec": {"generated": generated}}
    if keychain:
        doc["keychain"] = keychain
    if before:
        doc["workflow"][0]["next"] = {"arcs": [{"step": "run_child"}]}
    return doc


@pytest.fixture
def env(tmp_path, monkeypatch):
    monkeypatch.setenv("NOETL_DAGSTER_HOME", str(tmp_path / "home"))
    monkeypatch.setenv(
        "NOETL_CREDENTIAL_PG_MAIN",
        json.dumps({"type": "postgres", "data": {"db_user": "app", "db_password": SECRET}}),
    )
    store_url = f"sqlite:///{tmp_path / 'events.db'}"

    def run(doc: dict, workload: dict | None = None):
        pb = load_playbook_dict(doc)
        res = run_playbook(pb, workload, event_store=store_url, data_dir=tmp_path / "home")
        store = open_event_store(store_url)
        return res, store

    return run


def all_events(store):
    return [se.event for se in store.iter_all()]


def children(store, parent_id: str) -> list:
    return [
        e
        for e in all_events(store)
        if e.name == "playbook.execution.requested" and e.parent_execution_id == parent_id
    ]


def child_error(res) -> dict:
    out = res.results["run_child"]
    assert out["status"] == "error", out
    return out["error"]


def assert_no_secret(store):
    for e in all_events(store):
        assert SECRET not in json.dumps(e.to_dict() if hasattr(e, "to_dict") else e.__dict__, default=str)


GENERATED_OK = {"allow_kinds": ["python", "noop"], "allow_credentials": ["pg_main"]}


def test_inline_mapping_runs_as_a_sub_execution_with_its_own_events_and_replay(env):
    res, store = env(parent_doc({"definition": CHILD, "input": {"b": 40}}, generated=GENERATED_OK))
    assert res.status == "completed", res.results
    out = res.results["run_child"]
    assert out["sum"] == 41  # the child's own templates saw the child's workload, not the parent's scope
    reqs = children(store, res.execution_id)
    assert len(reqs) == 1
    req = reqs[0]
    child_id = req.execution_id
    assert out["execution_id"] == child_id
    # identity: sha256 of the canonical YAML, recorded with the definition on the child's request
    expected = playbook_id(load_playbook_dict(CHILD))
    assert req.data["playbook_id"] == expected == out["playbook_id"]
    assert req.data["ephemeral"] is True
    assert load_playbook_dict(yaml.safe_load(req.data["definition"])) == load_playbook_dict(CHILD)
    assert req.data["definition"] == canonical_yaml(load_playbook_dict(CHILD))
    # its own event log, replayable on its own
    child_events = store.read(child_id)
    assert child_events[-1].name == "playbook.processed"
    state = replay(store, child_id)
    assert state.status == "completed"
    assert state.result("add")["sum"] == 41


def test_definition_produced_by_an_earlier_step_mapping_and_yaml_text(env):
    # the generating step builds the definition as data (its code is never rendered as a template)
    plan_mapping = {"step": "plan", "tool": [{"make": {"kind": "python", "code": f"result = {CHILD!r}"}}]}
    res, store = env(
        parent_doc(
            {"definition": "{{ plan }}", "input": {"a": 5}}, generated=GENERATED_OK, before=[plan_mapping]
        )
    )
    assert res.status == "completed", res.results
    assert res.results["run_child"]["sum"] == 7
    text = yaml.safe_dump(CHILD)
    plan_text = {
        "step": "plan",
        "tool": [{"make": {"kind": "python", "code": f"result = {{'yaml': {text!r}}}"}}],
    }
    res2, store2 = env(
        parent_doc({"definition": "{{ plan.yaml }}"}, generated=GENERATED_OK, before=[plan_text])
    )
    assert res2.status == "completed", res2.results
    assert res2.results["run_child"]["sum"] == 3
    # the same content gets the same id, however it reached the runtime
    assert res2.results["run_child"]["playbook_id"] == res.results["run_child"]["playbook_id"]
    other = json.loads(json.dumps(CHILD))
    other["workload"]["a"] = 2
    res3, _ = env(parent_doc({"definition": other}, generated=GENERATED_OK))
    assert res3.results["run_child"]["playbook_id"] != res.results["run_child"]["playbook_id"]


def test_builder_made_child_in_a_builder_made_parent(env, tmp_path):
    child = (
        playbook("built_child", path="generated/built")
        .workload(n=3)
        .step(
            "start",
            tool=python("def main(n):\n    return {'square': n * n}\n", input={"n": "{{ workload.n }}"}),
        )
    )
    parent = (
        playbook("built_parent", path="tests/built_parent")
        .executor(generated={"allow_kinds": ["python"], "allow_credentials": []})
        .step("start", tool=subplaybook(definition=child, input={"n": 9}))
    )
    res = run_playbook(
        parent.build(), event_store=f"sqlite:///{tmp_path / 'b.db'}", data_dir=tmp_path / "home"
    )
    assert res.status == "completed", res.results
    assert res.results["start"]["square"] == 81
    assert res.results["start"]["playbook_id"] == playbook_id(child.build())


# -- the trust boundary -------------------------------------------------------------------------


def test_forbidden_tool_kind_is_refused_before_the_child_starts(env):
    res, store = env(parent_doc({"definition": CHILD}, generated={"allow_kinds": ["noop"]}))
    err = child_error(res)
    assert err["kind"] == "generated_playbook_refused"
    assert "tool kind 'python' is not allowed" in err["message"]
    assert res.status == "failed"
    assert children(store, res.execution_id) == []  # never started


def test_no_generated_policy_allows_nothing(env):
    res, store = env(parent_doc({"definition": CHILD}))
    err = child_error(res)
    assert err["kind"] == "generated_playbook_refused" and "allow_kinds: []" in err["message"]
    assert children(store, res.execution_id) == []


def _child_with_credential(**extra) -> dict:
    child = json.loads(json.dumps(CHILD))
    child["keychain"] = [{"name": "pg_main"}]
    child["workflow"][1]["tool"][0]["calc"]["input"]["pw"] = "{{ keychain.pg_main.db_password }}"
    child["workflow"][1]["tool"][0]["calc"]["code"] = (
        "def main(a, b, pw):\n    return {'sum': a + b, 'pw_len': len(pw)}\n"
    )
    child.update(extra)
    return child


def test_undeclared_credential_is_refused_and_never_leaks(env):
    # the parent itself uses the credential, so the secret is live in this process
    parent_kc = [{"name": "pg_main", "kind": "credential", "credential": "pg_main"}]
    use = {"step": "use", "tool": [{"peek": {"kind": "python", "input": {"pw": "{{ keychain.pg_main.db_password }}"},
                                               "code": "def main(pw):\n    return {'n': len(pw)}\n"}}]}  # fmt: skip
    # allowed by policy but not passed by the call
    res, store = env(
        parent_doc(
            {"definition": _child_with_credential()}, generated=GENERATED_OK, before=[use], keychain=parent_kc
        )
    )
    assert res.results["use"]["n"] == len(SECRET)
    err = child_error(res)
    assert err["kind"] == "generated_playbook_refused"
    assert "credential 'pg_main'" in err["message"] and "delegated: []" in err["message"]
    assert children(store, res.execution_id) == []
    # passed by the call but not allowed by the executor policy
    res2, store2 = env(parent_doc({"definition": _child_with_credential(), "credentials": ["pg_main"]},
                                  generated={"allow_kinds": ["python"], "allow_credentials": []}))  # fmt: skip
    err2 = child_error(res2)
    assert err2["kind"] == "generated_playbook_refused" and "not allowed" in err2["message"]
    assert_no_secret(store)
    assert_no_secret(store2)


def test_delegated_credential_resolves_and_is_redacted_from_every_event(env):
    res, store = env(
        parent_doc(
            {"definition": _child_with_credential(), "credentials": ["pg_main"]}, generated=GENERATED_OK
        )
    )
    assert res.status == "completed", res.results
    assert res.results["run_child"]["pw_len"] == len(SECRET)
    req = children(store, res.execution_id)[0]
    assert req.data["delegated_credentials"] == ["pg_main"]
    assert_no_secret(store)


def test_a_credential_reached_at_run_time_outside_the_delegation_is_refused(env):
    child = json.loads(json.dumps(CHILD))
    # not visible to the static check: the name is built at run time
    child["workflow"][1]["tool"][0]["calc"]["code"] = (
        "def main(a, b, context):\n    return {'pw': context['keychain']['pg_' + 'main']['db_password']}\n"
    )
    res, store = env(parent_doc({"definition": child}, generated=GENERATED_OK))
    err = child_error(res)
    assert err["kind"] == "playbook_failed"
    kids = children(store, res.execution_id)
    assert len(kids) == 1
    child_state = replay(store, kids[0].execution_id)
    inner = child_state.result("add")["error"]
    assert (
        inner["message"] == "KeyError: 'keychain'"
    )  # generated python runs in a subprocess without the keychain
    assert_no_secret(store)
    # a template naming the credential at run time gets nothing
    child3 = json.loads(json.dumps(CHILD))
    calc = child3["workflow"][1]["tool"][0]["calc"]
    calc["input"]["pw"] = "{% set n = 'pg_' ~ 'main' %}{{ keychain[n].db_password }}"
    calc["code"] = "def main(a, b, pw):\n    return {'pw': pw}\n"
    res3, store3 = env(parent_doc({"definition": child3}, generated=GENERATED_OK))
    assert res3.status == "completed", res3.results
    assert res3.results["run_child"]["pw"] in ("", None)
    assert_no_secret(store3)
    # an `auth:` name outside the delegation is refused by the keychain itself
    child2 = json.loads(json.dumps(CHILD))
    child2["workflow"][1]["tool"] = [
        {"q": {"kind": "postgres", "auth": "{{ 'pg_' ~ 'main' }}", "command": "select 1"}}
    ]
    res2, store2 = env(parent_doc({"definition": child2}, generated={"allow_kinds": ["postgres"]}))
    kids2 = children(store2, res2.execution_id)
    inner2 = replay(store2, kids2[0].execution_id).result("add")["error"]
    assert inner2["kind"] == "credential_not_delegated", inner2
    assert_no_secret(store2)


@pytest.mark.parametrize(
    ("mutate", "rule"),
    [
        (lambda c: c.pop("workflow"), "workflow-required"),
        (lambda c: c["workflow"][0]["next"]["arcs"].append({"step": "nowhere"}), "unknown-arc-target"),
        (lambda c: c["workflow"][1]["tool"][0]["calc"].update(kind="no_such_kind"), "unknown-tool-kind"),
        (lambda c: c.update(vars={"x": 1}), "root-vars"),
        (lambda c: c["workflow"][1].update(when="{{ true }}"), "step-when"),
    ],
)
def test_invalid_structure_is_refused_with_the_validator_rule(env, mutate, rule):
    child = json.loads(json.dumps(CHILD))
    mutate(child)
    res, store = env(parent_doc({"definition": child}, generated=GENERATED_OK))
    err = child_error(res)
    assert err["kind"] == "generated_playbook_invalid"
    assert rule in err["message"]
    assert children(store, res.execution_id) == []


def test_yaml_text_that_does_not_parse_and_a_non_mapping_are_refused(env):
    for bad in ("workflow: [unclosed", textwrap.dedent("- just\n- a list\n")):
        res, _ = env(parent_doc({"definition": bad}, generated=GENERATED_OK))
        assert child_error(res)["kind"] == "generated_playbook_invalid"


def test_restriction_is_inherited_and_only_narrows(env):
    """A generated child cannot widen its own grant for its own generated children."""
    grandchild = json.loads(json.dumps(CHILD))
    child = {
        "apiVersion": "noetl.io/v2", "kind": "Playbook",
        "metadata": {"name": "middle", "path": "generated/middle"},
        "executor": {"spec": {"generated": {"allow_kinds": ["python", "playbook", "http"], "allow_credentials": ["pg_main"]}}},
        "workflow": [{"step": "start", "tool": [{"inner": {"kind": "playbook", "definition": grandchild}}]}],
    }  # fmt: skip
    res, store = env(parent_doc({"definition": child}, generated={"allow_kinds": ["playbook", "noop"]}))
    err = child_error(res)
    assert err["kind"] == "playbook_failed"
    middle = children(store, res.execution_id)[0]
    inner = replay(store, middle.execution_id).result("start")["error"]
    assert inner["kind"] == "generated_playbook_refused"
    assert "not allowed" in inner["message"]
    assert children(store, middle.execution_id) == []


def test_a_crashed_generated_child_resumes_from_its_log_with_its_grant(env, tmp_path):
    """Only the child's events survive (the definition is on its request); resume rebuilds the
    playbook from them and keeps the delegation: the delegated name resolves, nothing else does."""
    from noetl_dagster.runners.local import resume_execution

    res, store = env(
        parent_doc(
            {"definition": _child_with_credential(), "credentials": ["pg_main"]}, generated=GENERATED_OK
        )
    )
    child_id = children(store, res.execution_id)[0].execution_id
    events = store.read(child_id)
    cut = next(i for i, e in enumerate(events) if e.name == "step.started" and e.step == "add")
    crashed_url = f"sqlite:///{tmp_path / 'crashed.db'}"
    crashed = open_event_store(crashed_url)
    crashed.append(events[:cut])  # the process died just before `add` ran
    resumed = resume_execution(child_id, event_store=crashed_url, data_dir=tmp_path / "home")
    assert resumed.status == "completed", resumed.results
    assert resumed.playbook == "generated/sum"
    assert resumed.results["add"]["pw_len"] == len(SECRET)
    assert_no_secret(crashed)
    # the same log with the credential reached outside the delegation: refused after resume too
    child = _child_with_credential()
    child["workflow"][1]["tool"] = [
        {"q": {"kind": "postgres", "auth": "{{ 'other_' ~ 'cred' }}", "command": "select 1"}}
    ]
    res2, store2 = env(parent_doc({"definition": child, "credentials": ["pg_main"]},
                                  generated={"allow_kinds": ["postgres"], "allow_credentials": ["pg_main"]}))  # fmt: skip
    cid2 = children(store2, res2.execution_id)[0].execution_id
    ev2 = store2.read(cid2)
    cut2 = next(i for i, e in enumerate(ev2) if e.name == "step.started" and e.step == "add")
    url2 = f"sqlite:///{tmp_path / 'crashed2.db'}"
    open_event_store(url2).append(ev2[:cut2])
    again = resume_execution(cid2, event_store=url2, data_dir=tmp_path / "home")
    assert again.results["add"]["error"]["kind"] == "credential_not_delegated"


def test_ephemeral_catalog_row_when_a_registry_is_configured(env, tmp_path, monkeypatch):
    from noetl_registry.client import open_registry

    monkeypatch.delenv("NOETL_REGISTRY_URL", raising=False)

    reg = str(tmp_path / "registry.db")
    res, store = env(parent_doc({"definition": CHILD, "registry": reg}, generated=GENERATED_OK))
    assert res.status == "completed", res.results
    pid = res.results["run_child"]["playbook_id"]
    rows = [r for r in open_registry(reg).list(q="ephemeral") if r.metadata.get("playbook_id") == pid]
    assert len(rows) == 1, open_registry(reg).list()
    row = rows[0]
    assert row.metadata["parent_execution_id"] == res.execution_id
    assert row.execution_id == res.results["run_child"]["execution_id"]
    assert row.metadata["definition"] == canonical_yaml(load_playbook_dict(CHILD))
    # without a registry configured for the execution nothing is written anywhere
    res2, _ = env(parent_doc({"definition": CHILD}, generated=GENERATED_OK))
    assert res2.status == "completed"
    assert not (tmp_path / "home" / "registry.db").exists()
    assert [r for r in open_registry(reg).list(q="ephemeral") if r.metadata.get("playbook_id") == pid] == rows


def test_generated_python_runs_without_the_workers_credential_environment(env, monkeypatch):
    monkeypatch.setenv("SOME_API_TOKEN", "tok-" + SECRET)
    probe = json.loads(json.dumps(CHILD))
    probe["workflow"][1]["tool"][0]["calc"]["code"] = (
        "import os\n"
        "def main(a, b):\n"
        "    return {'seen': sorted(k for k in os.environ if k.startswith('NOETL_CREDENTIAL') or k == 'SOME_API_TOKEN'),\n"
        "            'home': 'NOETL_DAGSTER_HOME' in os.environ}\n"
    )
    res, store = env(parent_doc({"definition": probe}, generated=GENERATED_OK))
    assert res.status == "completed", res.results
    assert res.results["run_child"]["seen"] == []
    assert res.results["run_child"]["home"] is True  # the rest of the environment is there
    # the same code in the parent (not generated) sees the worker's environment as before
    own = {"step": "own", "tool": [{"p": {"kind": "python", "code": probe["workflow"][1]["tool"][0]["calc"]["code"],
                                          "input": {"a": 1, "b": 2}}}]}  # fmt: skip
    res2, _ = env(parent_doc({"definition": CHILD}, generated=GENERATED_OK, before=[own]))
    assert res2.results["own"]["seen"] == ["NOETL_CREDENTIAL_PG_MAIN", "SOME_API_TOKEN"]
    assert_no_secret(store)


def _child_reading(uri: str) -> dict:
    child = json.loads(json.dumps(CHILD))
    child["workflow"][1]["tool"][0]["calc"]["input"]["src"] = uri
    child["workflow"][1]["tool"][0]["calc"]["code"] = (
        "def main(a, b, src):\n    return {'sum': a + b, 'src': src}\n"
    )
    return child


def test_a_cross_tenant_resource_is_refused_with_an_error_event(tmp_path, monkeypatch):
    monkeypatch.setenv("NOETL_DAGSTER_HOME", str(tmp_path / "home"))
    monkeypatch.setenv(
        "NOETL_CREDENTIAL_PG_MAIN", json.dumps({"type": "postgres", "data": {"db_password": SECRET}})
    )
    url = f"sqlite:///{tmp_path / 'events.db'}"

    def run(child):
        pb = load_playbook_dict(parent_doc({"definition": child}, generated=GENERATED_OK))
        return run_playbook(
            pb, None, event_store=url, data_dir=tmp_path / "home", tenant="acme", project="p1"
        )

    res = run(_child_reading("noetl://globex/finance/tables/table/payroll@v3"))
    err = child_error(res)
    assert err["kind"] == "generated_playbook_refused"
    assert "tenant 'globex', not this execution's tenant 'acme'" in err["message"]
    store = open_event_store(url)
    assert children(store, res.execution_id) == []  # nothing ran in the child
    done = [e for e in all_events(store) if e.execution_id == res.execution_id and e.name == "task.done"
            and e.step == "run_child"]  # fmt: skip
    assert done and done[-1].status == "error"
    assert done[-1].data["outcome"]["error"]["kind"] == "generated_playbook_refused"
    assert_no_secret(store)
    # the parent's own tenant is fine
    ok = run(_child_reading("noetl://acme/p1/tables/table/orders"))
    assert ok.status == "completed", ok.results
    assert ok.results["run_child"]["src"] == "noetl://acme/p1/tables/table/orders"
