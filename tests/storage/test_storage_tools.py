"""kind: parquet | arrow | iceberg in real playbooks run by the local runner: one playbook
writes, another resolves the noetl:// URI and reads the rows back; tenancy applies."""

from __future__ import annotations

from pathlib import Path

import pytest

from noetl_dagster.runners.local import run_playbook
from noetl_dagster.storage.tables import table_checksum, to_arrow
from noetl_dagster.tools.registry import ToolError, get_tool
from noetl_dagster.tools.storage import write_sink
from noetl_registry.client import open_registry

ROWS = [
    {"id": 1, "amount": 10.5, "region": "eu"},
    {"id": 2, "amount": 3.25, "region": "us"},
    {"id": 3, "amount": 7.0, "region": "eu"},
]

WRITE = """
apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: write_orders, path: tests/write_orders}
workload:
  rows: []
workflow:
  - step: start
    tool:
      - raw:
          kind: arrow
          resource: orders_raw
          namespace: sales
          data: "{{ workload.rows }}"
      - as_parquet:
          kind: parquet
          uri: noetl://acme/lab/sales/dataset/orders_pq
          data: "{{ workload.rows }}"
          inputs: ["{{ raw.uri }}"]
      - as_iceberg:
          kind: iceberg
          resource: orders_ice
          namespace: sales
          data: {rows: "{{ workload.rows }}"}
          mode: overwrite
          partition_by: [region]
    set:
      ctx.refs:
        arrow: "{{ raw }}"
"""

READ = """
apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: read_orders, path: tests/read_orders}
workload:
  uri: ""
  kind: parquet
workflow:
  - step: start
    tool:
      - load:
          kind: "{{ workload.kind }}"
          op: read
          uri: "{{ workload.uri }}"
"""


@pytest.fixture
def playbooks(tmp_path) -> tuple[Path, Path]:
    w, r = tmp_path / "write.yaml", tmp_path / "read.yaml"
    w.write_text(WRITE)
    r.write_text(READ.replace('kind: "{{ workload.kind }}"', "kind: KIND"))
    return w, r


def _reader(tmp_path: Path, kind: str) -> Path:
    p = tmp_path / f"read_{kind}.yaml"
    p.write_text(READ.replace('kind: "{{ workload.kind }}"', f"kind: {kind}"))
    return p


def test_registered():
    for kind in ("parquet", "arrow", "iceberg"):
        assert get_tool(kind) is not None


def test_one_playbook_writes_another_reads_back_identical(tmp_path, playbooks, data_dir):
    write, _ = playbooks
    res = run_playbook(write, {"rows": ROWS}, tenant="acme", project="lab", data_dir=data_dir)
    assert res.status == "completed", res.results
    ice_ref = res.results["start"]  # the pipeline's last task result
    assert ice_ref["uri"] == "noetl://acme/lab/sales/dataset/orders_ice@v1" and ice_ref["rows"] == 3
    assert "rows" not in ice_ref or isinstance(ice_ref["rows"], int)  # a reference, never the body

    expected = table_checksum(to_arrow(ROWS))
    for kind, uri in (
        ("arrow", "noetl://acme/lab/sales/dataset/orders_raw"),
        ("parquet", "noetl://acme/lab/sales/dataset/orders_pq@v1"),
        ("iceberg", "urn:noetl:acme:lab:sales:dataset:orders_ice:v1"),
    ):
        got = run_playbook(
            _reader(tmp_path, kind), {"uri": uri}, tenant="acme", project="lab", data_dir=data_dir
        )
        assert got.status == "completed", got.results
        out = got.results["start"]
        assert out["row_count"] == 3 and out["columns"] == ["id", "amount", "region"]
        rows = sorted(out["rows"], key=lambda r: r["id"])  # a partitioned Iceberg scan groups by partition
        assert table_checksum(to_arrow(rows)) == expected, kind
        assert out["ref"]["checksum"].startswith("sha256:")

    registry = open_registry(str(data_dir / "registry.db"), tenant="acme", project="lab")
    pq = registry.resolve("noetl://acme/lab/sales/dataset/orders_pq")
    lineage = registry.lineage(pq.resource_id, "up")
    assert [e.resource.uri for e in lineage.edges] == ["noetl://acme/lab/sales/dataset/orders_raw@v1"]
    assert lineage.edges[0].execution_id == res.execution_id and lineage.edges[0].step == "start"
    ice = registry.resolve("noetl://acme/lab/sales/dataset/orders_ice")
    assert ice.location.metadata["partition_spec"][0]["source"] == "region"


def test_another_tenant_is_refused_until_granted(tmp_path, playbooks, data_dir):
    write, _ = playbooks
    assert (
        run_playbook(write, {"rows": ROWS}, tenant="acme", project="lab", data_dir=data_dir).status
        == "completed"
    )
    reader = _reader(tmp_path, "parquet")
    uri = "noetl://acme/lab/sales/dataset/orders_pq@v1"
    denied = run_playbook(reader, {"uri": uri}, tenant="beta", project="x", data_dir=data_dir)
    assert denied.status == "failed"
    err = denied.results["start"]["error"]
    assert err["kind"] == "registry_forbidden" and err["code"] == 403
    open_registry(str(data_dir / "registry.db"), tenant="acme", project="lab").grant(uri, "tenant:beta")
    allowed = run_playbook(reader, {"uri": uri}, tenant="beta", project="x", data_dir=data_dir)
    assert allowed.status == "completed" and allowed.results["start"]["row_count"] == 3


def test_bad_inputs_give_clear_errors(tmp_path, data_dir):
    pb = tmp_path / "bad.yaml"
    cases = {
        "uri: noetl://acme/lab/../x/dataset/y": "config_error",
        "resource: ok": "config_error",  # no data
        "data: [1, 2]\n          resource: ok": "config_error",  # not records
        "data: [{a: 1}]\n          resource: ok\n          op: delete": "config_error",
        "data: [{a: 1}]\n          resource: ok\n          colour: red": "config_error",
        "data: [{a: 1}]\n          resource: ok\n          checksum: md5": "config_error",
    }
    for body, kind in cases.items():
        pb.write_text(f"""
apiVersion: noetl.io/v2
kind: Playbook
metadata: {{name: bad, path: tests/bad}}
workflow:
  - step: start
    tool:
      - w:
          kind: parquet
          {body}
""")
        res = run_playbook(pb, tenant="acme", project="lab", data_dir=data_dir)
        assert res.status == "failed" and res.results["start"]["error"]["kind"] == kind, (body, res.results)


class _Ctx:
    """The attributes the storage tools read from the engine's context."""

    def __init__(self, data_dir):
        self.execution_id, self.step, self.task, self.attempt = "exec_sink", "s", "t", 1
        self.tenant, self.project, self.data_dir = "acme", "lab", str(data_dir)
        self.spec, self.base_dir, self.render_context = {}, None, {}
        self._resources = {}

    def resource(self, key, factory):
        if key not in self._resources:
            self._resources[key] = factory()
        return self._resources[key]

    def redact(self, value):
        pass


def test_write_sink_hook_writes_any_result(data_dir):
    ctx = _Ctx(data_dir)
    ref = write_sink(
        {"rows": [[1, "a"], [2, "b"]], "columns": ["n", "s"]},
        {"kind": "arrow", "resource": "sunk", "namespace": "results"},
        ctx,
    )
    assert ref["uri"] == "noetl://acme/lab/results/dataset/sunk@v1" and ref["rows"] == 2
    with pytest.raises(ToolError, match="sink kind"):
        write_sink([], {"kind": "csv"}, ctx)


@pytest.mark.parametrize("kind", ["arrow", "parquet"])
def test_a_blake3_checksum_from_the_playbook_is_registered_and_verified_on_read(tmp_path, data_dir, kind):
    w = tmp_path / "w.yaml"
    w.write_text(f"""
apiVersion: noetl.io/v2
kind: Playbook
metadata: {{name: w, path: tests/w}}
workflow:
  - step: start
    tool:
      - out:
          kind: {kind}
          uri: noetl://acme/lab/sales/dataset/b3_{kind}
          checksum: blake3
          data: {ROWS!r}
""")
    res = run_playbook(w, tenant="acme", project="lab", data_dir=data_dir)
    assert res.status == "completed", res.results
    assert res.results["start"]["checksum"].startswith("blake3:")
    back = run_playbook(_reader(tmp_path, kind), {"uri": f"noetl://acme/lab/sales/dataset/b3_{kind}"},
                        tenant="acme", project="lab", data_dir=data_dir)  # fmt: skip
    assert back.status == "completed", back.results
    assert back.results["start"]["rows"] == ROWS
