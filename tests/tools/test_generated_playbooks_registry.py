"""A generated child's ephemeral catalog row: recorded with its parent, deletable only after the parent
is archived (then a tombstone: no definition, a pointer to the archive), while the events keep the
definition and the content id they referenced. Real executions, real registry (SQLite), real archive."""

from __future__ import annotations

import pytest
from test_generated_playbooks import CHILD, GENERATED_OK, children, env, parent_doc  # noqa: F401

from noetl_dagster.dsl import load_playbook_dict
from noetl_dagster.dsl.builder import canonical_yaml
from noetl_dagster.storage.archive import archive_execution
from noetl_registry.client import open_registry
from noetl_registry.errors import Conflict


def _row(reg, pid):
    rows = [r for r in reg.list(q="ephemeral") if r.metadata.get("playbook_id") == pid]
    assert len(rows) == 1, rows
    return rows[0]


def test_ephemeral_row_is_deletable_after_archival_and_events_keep_the_reference(env, tmp_path, monkeypatch):  # noqa: F811
    monkeypatch.delenv("NOETL_REGISTRY_URL", raising=False)
    reg_url = str(tmp_path / "registry.db")
    res, store = env(parent_doc({"definition": CHILD, "registry": reg_url}, generated=GENERATED_OK))
    assert res.status == "completed", res.results
    pid = res.results["run_child"]["playbook_id"]
    reg = open_registry(reg_url)
    row = _row(reg, pid)
    assert row.kind == "ephemeral_playbook" and row.status == "active"
    assert row.metadata["parent_execution_id"] == res.execution_id
    assert row.metadata["definition"] == canonical_yaml(load_playbook_dict(CHILD))

    # before the parent is archived the definition row must stay
    with pytest.raises(Conflict, match="not archived"):
        reg.delete_ephemeral(row.resource_id)
    assert _row(reg, pid).status == "active"

    manifest = archive_execution(res.execution_id, store, str(tmp_path / "archive"), registry=reg)
    assert manifest["status"] == "written" and manifest["children"]
    tomb = reg.delete_ephemeral(row.resource_id)
    assert tomb.status == "deleted" and "definition" not in tomb.metadata
    assert (
        tomb.metadata["archive"].endswith(f"execution_archive/{res.execution_id}")
        or res.execution_id in tomb.metadata["archive"]
    )
    assert (
        tomb.metadata["playbook_id"] == pid and tomb.uri == row.uri
    )  # the URI still resolves to the tombstone
    assert reg.get(row.resource_id).status == "deleted"
    assert reg.delete_ephemeral(row.resource_id).status == "deleted"  # idempotent

    # the events still hold the content id and the definition the row pointed at
    req = children(store, res.execution_id)[0]
    assert req.data["playbook_id"] == pid and req.data["definition"] == row.metadata["definition"]
    # the registry recorded the deletion as a catalog event
    assert any(e.name == "noetl.catalog.resource.ephemeral_deleted" and e.resource_id == row.resource_id
               for e in reg.events(limit=1000).events)  # fmt: skip


def test_only_ephemeral_rows_can_be_deleted(tmp_path):
    reg = open_registry(str(tmp_path / "r.db"))
    r = reg.register(
        "noetl://default/default/tables/table/t1", kind="table", metadata={"parent_execution_id": "x"}
    )
    with pytest.raises(Conflict, match="only ephemeral_playbook"):
        reg.delete_ephemeral(r.resource_id)
