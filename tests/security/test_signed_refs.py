"""Signed references (issue 41 part 2): a stored reference reads only through the locator.

The attack, as probed: a generated playbook limited to ``allow_kinds: [noop]`` (or ``parquet``),
running as tenant ``acme``, wrote a ``$ref`` envelope naming tenant ``globex``'s payload into a noop
``result`` (or a parquet ``data:``) and read globex's body; a wrong checksum printed the real one.
Real runs on the file store and on S3 (moto), a real registry for grants.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from noetl_dagster.dsl import load_playbook_dict
from noetl_dagster.runners.local import run_playbook
from noetl_dagster.storage.event_stores import open_event_store
from noetl_dagster.storage.locator import Locator, RefRefused, refusal
from noetl_dagster.storage.offload import Offloader
from noetl_dagster.storage.payload import ChecksumMismatch, ResultRef, open_payload_store

SECRET = "globex-pii-7f3a"
GLOBEX_EID = "01900000-0000-7000-8000-000000000000"


@pytest.fixture(params=["file", "s3"])
def store_url(request, tmp_path, monkeypatch):
    """The installation's payload store: the data dir's folder, or a bucket on moto."""
    monkeypatch.setenv("NOETL_DAGSTER_HOME", str(tmp_path / "home"))
    if request.param == "file":
        return None
    endpoint, bucket, _ = request.getfixturevalue("s3_bucket")
    url = f"s3://{bucket}/pre?endpoint_url={endpoint}&key=testing&secret=testing"
    monkeypatch.setenv("NOETL_PAYLOAD_STORE_URL", url)
    return url


def _store(tmp_path: Path, url: str | None):
    return open_payload_store(url, data_dir=tmp_path / "home")


def _globex_payload(tmp_path: Path, url: str | None) -> dict:
    """globex's stored result, as an attacker who learnt its URI (and even its checksum) writes it."""
    value = {"pii": SECRET, "rows": [{"pii": SECRET}]}  # a table too, for parquet's data:
    ref = _store(tmp_path, url).put_json(f"globex/default/{GLOBEX_EID}/start/s-1.json", value)
    return ref.envelope()


def _run(
    tmp_path: Path, child_tasks: list, *, kinds: list[str], tenant: str = "acme", extra: list | None = None
):
    child = {"apiVersion": "noetl.io/v2", "kind": "Playbook", "metadata": {"name": "gen", "path": "gen/x"},
             "workflow": [{"step": "start", "tool": child_tasks, **({"next": {"arcs": [{"step": "leak"}]}} if extra else {})},
                          *([{"step": "leak", "tool": extra}] if extra else [])]}  # fmt: skip
    doc = {"apiVersion": "noetl.io/v2", "kind": "Playbook", "metadata": {"name": "p", "path": "tests/p"},
           "executor": {"spec": {"generated": {"allow_kinds": kinds}}},
           "workflow": [{"step": "run_child", "tool": [{"c": {"kind": "playbook", "definition": child}}]}]}  # fmt: skip
    url = f"sqlite:///{tmp_path / 'ev.db'}"
    res = run_playbook(load_playbook_dict(doc), event_store=url, data_dir=tmp_path / "home", tenant=tenant)
    return res, open_event_store(url)


def _everything(res, store) -> str:
    events = [se.event.to_dict() for se in store.iter_all()]
    return json.dumps([res.results, events], default=str)


def test_a_noop_result_naming_another_tenants_payload_reads_nothing(tmp_path, store_url):
    env = _globex_payload(tmp_path, store_url)
    res, store = _run(tmp_path, [{"t": {"kind": "noop", "result": env}}], kinds=["noop"],
                      extra=[{"u": {"kind": "noop", "result": {"got": "{{ start.pii }}"}}}])  # fmt: skip
    assert res.status == "failed", res.results
    text = _everything(res, store)
    assert SECRET not in text
    message = res.results["run_child"]["error"]["message"]
    assert "reference refused for acme/default" in message and "\n" not in message


def test_parquet_data_naming_another_tenants_payload_reads_nothing(tmp_path, store_url):
    env = _globex_payload(tmp_path, store_url)
    task = {"kind": "parquet", "uri": "noetl://acme/default/stolen/dataset/t", "data": env}
    res, store = _run(tmp_path, [{"w": task}], kinds=["parquet"])
    assert res.status == "failed", res.results
    assert SECRET not in _everything(res, store)
    assert "reference refused for acme/default" in json.dumps(res.results)
    assert not list((tmp_path / "home").rglob("*.parquet"))  # nothing of globex's was written as acme's


def test_own_payloads_still_read_through_the_same_positions(tmp_path, store_url):
    """The platform's own references (signed for the execution's tenant) keep working."""
    big = {"rows": [{"i": i, "s": "x" * 40} for i in range(3000)]}
    doc = {"apiVersion": "noetl.io/v2", "kind": "Playbook", "metadata": {"name": "o", "path": "tests/o"},
           "workflow": [{"step": "start", "tool": [{"t": {"kind": "noop", "result": big}}], "next": {"arcs": [{"step": "use"}]}},
                        {"step": "use", "tool": [
                            {"w": {"kind": "parquet", "uri": "noetl://acme/default/own/dataset/t", "data": {"$ref": "{{ start._ref }}"}}},
                            {"r": {"kind": "artifact", "result_ref": "{{ start._ref }}", "select": ["rows.2999.i"]}},
                            {"n": {"kind": "noop", "result": {"last": "{{ start.rows[2999].i }}"}}}]}]}  # fmt: skip
    url = f"sqlite:///{tmp_path / 'ev.db'}"
    res = run_playbook(load_playbook_dict(doc), event_store=url, data_dir=tmp_path / "home", tenant="acme")
    assert res.status == "completed", res.results
    assert res.results["use"]["last"] == 2999 and res.results["start"]["rows"][0] == {"i": 0, "s": "x" * 40}


def test_a_wrong_checksum_never_prints_the_real_one(tmp_path):
    store = open_payload_store(tmp_path / "payloads")
    off = Offloader(store)
    ref = store.put_json("default/default/e1/s/r-1.json", {"a": "b" * 100})
    wrong = replace(ref, checksum="sha256:" + "0" * 64)
    with pytest.raises(ChecksumMismatch) as ei:
        off.resolve(wrong.envelope())
    assert ref.checksum not in str(ei.value) and ref.checksum.split(":")[1] not in str(ei.value)


def test_a_refusal_is_the_same_line_whether_or_not_the_object_exists(tmp_path):
    store = open_payload_store(tmp_path / "payloads")
    there = store.put_json(f"globex/default/{GLOBEX_EID}/s/r-1.json", {"pii": SECRET})
    absent = replace(there, uri=there.uri.replace("r-1", "r-2"))
    loc = Locator(store)
    messages = []
    for ref in (there, absent):
        with pytest.raises(RefRefused) as ei:
            loc.read(ref, "acme", "default")
        messages.append(str(ei.value).replace(ref.uri, "<uri>"))
        assert there.checksum.split(":")[1] not in str(ei.value)
    assert messages[0] == messages[1]


def _globex_run(tmp_path: Path):
    """globex's own execution with an offloaded (signed) result; returns (its envelope, execution id)."""
    doc = {"apiVersion": "noetl.io/v2", "kind": "Playbook", "metadata": {"name": "g", "path": "tests/g"},
           "workflow": [{"step": "start", "tool": [{"t": {"kind": "noop", "result": {"pii": SECRET, "pad": "x" * 70000}}}]}]}  # fmt: skip
    url = f"sqlite:///{tmp_path / 'ev.db'}"
    res = run_playbook(load_playbook_dict(doc), event_store=url, data_dir=tmp_path / "home", tenant="globex")
    assert res.status == "completed"
    done = [se.event for se in open_event_store(url).iter_all()
            if se.event.execution_id == res.execution_id and se.event.name == "step.done"]  # fmt: skip
    env = done[-1].data["result"]
    assert env["$ref"]["capability"]  # what the platform wrote is signed
    return env, res.execution_id


def test_a_registry_grant_lets_globex_share_with_acme(tmp_path, monkeypatch):
    from noetl_registry.client import open_registry

    monkeypatch.setenv("NOETL_DAGSTER_HOME", str(tmp_path / "home"))
    env, eid = _globex_run(tmp_path)

    def acme_reads():
        return _run(tmp_path, [{"t": {"kind": "noop", "result": env}}], kinds=["noop"],
                    extra=[{"u": {"kind": "noop", "result": {"got": "{{ start.pii }}"}}}])  # fmt: skip

    before, _ = acme_reads()
    assert before.status == "failed" and SECRET not in json.dumps(before.results)
    globex = open_registry(str(tmp_path / "home" / "registry.db"), tenant="globex", project="default")
    grant = globex.grant(f"noetl://globex/default/payloads/execution/{eid}", "tenant:acme")
    after, _ = acme_reads()
    assert after.status == "completed", after.results
    assert after.results["run_child"]["got"] == SECRET
    globex.revoke(grant.grant_id)
    revoked, _ = acme_reads()
    assert revoked.status == "failed" and SECRET not in json.dumps(revoked.results)


def test_forged_moved_and_expired_capabilities_are_refused(tmp_path, monkeypatch):
    from noetl_registry.client import open_registry

    monkeypatch.setenv("NOETL_DAGSTER_HOME", str(tmp_path / "home"))
    store = open_payload_store(tmp_path / "home" / "payloads")
    ref = store.put_json(f"globex/default/{GLOBEX_EID}/s/r-1.json", {"pii": SECRET})
    ref = replace(ref, execution_id=GLOBEX_EID)
    loc = Locator(store, data_dir=tmp_path / "home")
    open_registry(str(tmp_path / "home" / "registry.db"), tenant="globex", project="default").grant(
        f"noetl://globex/default/payloads/execution/{GLOBEX_EID}", "tenant:acme"
    )
    assert b"pii" in loc.read(loc.sign(ref, "globex", "default"), "acme", "default")  # granted
    own_claim = loc.sign(ref, "acme", "default")  # a valid signature of acme, on globex's object…
    version, kid, body, sig = own_claim.capability.split(".")
    claims = json.loads(__import__("base64").urlsafe_b64decode(body + "=" * (-len(body) % 4)))
    forged_body = (
        __import__("base64").urlsafe_b64encode(json.dumps({**claims, "u": "x"}).encode()).decode().rstrip("=")
    )
    cases = {
        "forged signature": replace(ref, capability=f"{version}.{kid}.{body}.{sig[:-4]}AAAA"),
        "forged claims": replace(ref, capability=f"{version}.{kid}.{forged_body}.{sig}"),
        "moved to another object": replace(loc.sign(ref, "acme", "default"), uri=ref.uri.replace("r-1", "r-9")),
        "expired, granted": Locator(store, ttl=-1).sign(ref, "globex", "default"),
        "no grant for this project": replace(loc.sign(ref, "globex", "other"), capability=loc.sign(ref, "globex", "other").capability),
    }  # fmt: skip
    for name, bad in cases.items():
        with pytest.raises(RefRefused) as ei:
            loc.read(bad, "acme", "default")
        assert str(ei.value) == str(refusal(bad.uri, "acme", "default")), name
    # an expired capability of the reader's own payload falls back to the unsigned rule: still its own
    mine = store.put_json("acme/default/e2/s/r-1.json", {"a": 1})
    assert loc.read(Locator(store, ttl=-1).sign(mine, "acme", "default"), "acme", "default") == b'{"a":1}'


def test_unsigned_references_of_older_executions_read_for_their_own_tenant_only(tmp_path, monkeypatch):
    """Backward compatibility: a reference recorded before capabilities (none) reads for the tenant
    whose payload prefix holds it, nothing else; NOETL_UNSIGNED_REFS=refuse turns that off."""
    store = open_payload_store(tmp_path / "payloads")
    mine = store.put_json("acme/default/e1/s/r-1.json", {"a": 1})
    theirs = store.put_json(f"globex/default/{GLOBEX_EID}/s/r-1.json", {"pii": SECRET})
    off = Offloader(store)
    assert off.resolve(mine.envelope(), ("acme", "default")) == {"a": 1}
    for ref, reader in (
        (theirs, ("acme", "default")),
        (mine, ("acme", "other")),
        (mine, ("acmecorp", "default")),
    ):
        with pytest.raises(RefRefused):
            off.resolve(ref.envelope(), reader)
    monkeypatch.setenv("NOETL_UNSIGNED_REFS", "refuse")
    with pytest.raises(RefRefused):
        off.resolve(mine.envelope(), ("acme", "default"))


def test_replay_bodies_of_the_attack_show_a_refusal_not_the_body(tmp_path, monkeypatch):
    from click.testing import CliRunner

    from noetl_dagster.commands.main import cli

    monkeypatch.setenv("NOETL_DAGSTER_HOME", str(tmp_path / "home"))
    env = _globex_payload(tmp_path, None)
    doc = {"apiVersion": "noetl.io/v2", "kind": "Playbook", "metadata": {"name": "a", "path": "tests/a"},
           "workflow": [{"step": "start", "tool": [{"t": {"kind": "noop", "result": env}}]}]}  # fmt: skip
    url = f"sqlite:///{tmp_path / 'ev.db'}"
    res = run_playbook(load_playbook_dict(doc), event_store=url, data_dir=tmp_path / "home", tenant="acme")
    assert res.results["start"]["status"] == "refused" and SECRET not in json.dumps(res.results)
    out = CliRunner().invoke(cli, ["replay", res.execution_id, "--bodies", "--json", "--event-store", url,
                                   "--data-dir", str(tmp_path / "home")])  # fmt: skip
    assert out.exit_code == 0, out.output
    assert SECRET not in out.output and '"refused"' in out.output


def test_the_platform_signs_what_it_offloads(tmp_path):
    store = open_payload_store(tmp_path / "payloads")
    env = Offloader(store, inline_limit=10).maybe_offload(
        {"a": "b" * 50}, "acme/p/e/s/r-1", owner=("acme", "p")
    )
    ref = ResultRef.from_dict(env["$ref"])
    assert ref.capability and ref.capability.startswith("v1.")
    Locator(store).authorize(ref, "acme", "p")
    with pytest.raises(RefRefused):
        Locator(store).authorize(ref, "globex", "p")
