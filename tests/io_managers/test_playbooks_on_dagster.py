"""Acceptance, through the playbook -> Dagster translator: one playbook writes a table with each
storage kind, a second resolves each by noetl:// URI, reads it back identical and stores a
derived copy; both runs materialize the assets in Dagster's catalog and the registry keeps
the lineage."""

from __future__ import annotations

import dagster as dg
import pytest

from noetl_dagster.resources.noetl import NoetlResource
from noetl_dagster.storage.tables import TableStorage, table_checksum, to_arrow
from noetl_dagster.translator import NoetlTranslator, compile_playbooks
from noetl_registry.client import open_registry

ROWS = [
    {"id": 1, "amount": 10.5, "region": "eu"},
    {"id": 2, "amount": 3.25, "region": "us"},
    {"id": 3, "amount": 7.0, "region": "eu"},
]  # the writer playbook's workload
KINDS = ("parquet", "arrow", "iceberg")

HEAD = """
apiVersion: noetl.io/v2
kind: Playbook
metadata: {{name: {name}, path: tests/{name}}}
workload:
  rows:
    - {{id: 1, amount: 10.5, region: eu}}
    - {{id: 2, amount: 3.25, region: us}}
    - {{id: 3, amount: 7.0, region: eu}}
workflow:
"""


def _steps(bodies: list[str]) -> str:
    """One step per kind, chained; a step's result (its last task's) is what Dagster materializes."""
    out = ""
    for i, body in enumerate(bodies):
        nxt = f"    next: {{arcs: [{{step: s{i + 1}}}]}}\n" if i + 1 < len(bodies) else ""
        out += f"  - step: {'start' if i == 0 else f's{i}'}\n    tool:\n{body}{nxt}"
    return out


def _writer() -> str:
    return HEAD.format(name="store_orders") + _steps(
        [
            f"      - w_{k}:\n          kind: {k}\n          uri: noetl://acme/lab/shared/dataset/orders_{k}\n"
            f'          data: "{{{{ workload.rows }}}}"\n'
            for k in KINDS
        ]
    )


def _reader() -> str:
    return HEAD.format(name="copy_orders") + _steps(
        [
            f"      - r_{k}:\n          kind: {k}\n          op: read\n"
            f"          uri: noetl://acme/lab/shared/dataset/orders_{k}@latest\n"
            f"      - c_{k}:\n          kind: parquet\n"
            f"          uri: noetl://acme/lab/copies/dataset/orders_{k}\n"
            f'          data: "{{{{ r_{k}.rows }}}}"\n'
            f'          inputs: ["{{{{ r_{k}.ref.uri }}}}"]\n'
            for k in KINDS
        ]
    )


@pytest.fixture
def location(tmp_path, home):
    (tmp_path / "store_orders.yaml").write_text(_writer())
    (tmp_path / "copy_orders.yaml").write_text(_reader())
    resource = NoetlResource(data_dir=str(home), tenant="acme", project="lab")
    return compile_playbooks(
        [tmp_path / "store_orders.yaml", tmp_path / "copy_orders.yaml"],
        resource=resource,
        include_sensor=False,
    )


def test_writer_and_reader_playbooks_on_dagster(location, instance, home):
    writer = location.definitions.resolve_job_def("store_orders")
    assert writer.execute_in_process(instance=instance).success
    reader = location.definitions.resolve_job_def("copy_orders")
    assert reader.execute_in_process(instance=instance).success

    client = open_registry(f"sqlite:///{home / 'registry.db'}", tenant="acme", project="lab")
    storage = TableStorage(client, data_dir=home)
    expected = table_checksum(to_arrow(ROWS))
    for k in KINDS:
        source = client.resolve(f"noetl://acme/lab/shared/dataset/orders_{k}")
        copy = client.resolve(f"noetl://acme/lab/copies/dataset/orders_{k}")
        # read back identical (Iceberg scans need not keep row order)
        rows = sorted(storage.fetch(copy.uri, as_type="records")[0], key=lambda r: r["id"])
        assert table_checksum(to_arrow(rows)) == expected, k
        assert [e.resource.uri for e in client.lineage(copy.resource_id, "up").edges] == [source.uri]
        for uri in (source.uri, copy.uri):  # both runs put their outputs in Dagster's catalog
            event = instance.get_latest_materialization_event(NoetlTranslator().get_asset_key(uri))
            assert event is not None, uri
            md = event.asset_materialization.metadata
            assert md["noetl/uri"].value == uri and md["noetl/checksum"].value.startswith("sha256:")
        copy_md = instance.get_latest_materialization_event(
            dg.AssetKey(["copies", f"orders_{k}"])
        ).asset_materialization.metadata
        assert source.uri in copy_md["noetl/inputs"].value
