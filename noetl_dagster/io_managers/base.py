"""Shared behaviour of the reference-first IO managers.

Each output becomes a new version of a ``noetl://`` resource: the table is
written (Parquet, Arrow IPC or Iceberg), registered in the NoETL registry with
its checksum and its inputs (lineage), and described to Dagster with
``dagster/row_count``, ``dagster/column_schema`` and ``noetl/*`` metadata.
Each input is resolved through the registry (tenancy and grants apply), read,
verified against the recorded checksum and returned as the annotated type
(``pa.Table``, ``pl.DataFrame``, ``pd.DataFrame``, ``list`` of records, ``dict``
of columns; otherwise ``load_as``).

Which resource an asset is:
1. ``metadata={"noetl/uri": "noetl://t/p/ns/type/name"}`` on the asset or output;
2. an asset key ``[tenant, project, namespace, *name]`` whose first two parts are the
   registry scope (what :func:`noetl_dagster.dsl.locator.asset_key_for_uri` returns);
3. otherwise ``noetl://<tenant>/<project>/<namespace config>/<resource_type>/<asset key joined by '/'>``.
Op outputs that are not assets get ``<namespace>/<type>/runs/<run_id>/<step>/<output>``.
An input may pin a version with ``metadata={"noetl/version": "v3"}``; by default the newest.
"""

from __future__ import annotations

import re
import threading
from typing import Any, ClassVar

import dagster as dg
from pydantic import Field, PrivateAttr, field_validator

from noetl_dagster.dsl.locator import InvalidLocator, ResourceLocator, parse_locator
from noetl_dagster.resources.registry import NoetlRegistryResource
from noetl_dagster.storage.payload import CHECKSUM_ALGORITHMS, checksum_algorithm
from noetl_dagster.storage.tables import AS_TYPES, TableStorage, convert
from noetl_registry.errors import RegistryError

META_URI = "noetl/uri"
META_VERSION = "noetl/version"
META_TYPE = "noetl/type"
META_INPUTS = "noetl/inputs"
META_MODE = "noetl/mode"
META_PARTITION_BY = "noetl/partition_by"

_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]+")

# Versions each step read, shared by all our IO managers in the process: the input of a step
# may come through one IO manager (say Iceberg) and its output go through another (Parquet).
_LOADED: dict[tuple[str, str], list[str]] = {}
_LOADED_LOCK = threading.Lock()
_LOADED_MAX = 10_000


def _remember_loaded(run_id: str, step_key: str, uri: str) -> None:
    with _LOADED_LOCK:
        if len(_LOADED) >= _LOADED_MAX:  # steps that loaded but never wrote through us
            _LOADED.pop(next(iter(_LOADED)))
        _LOADED.setdefault((run_id, step_key), []).append(uri)


def _take_loaded(run_id: str, step_key: str) -> list[str]:
    with _LOADED_LOCK:
        return _LOADED.pop((run_id, step_key), [])


def _safe_segment(text: str) -> str:
    seg = _UNSAFE.sub("_", text).strip("._-") or "x"
    return seg if seg[0].isalnum() else "x" + seg


def _as_type_for(typing_type: Any, default: str) -> str:
    """Which in-memory type a downstream input asked for."""
    if typing_type is None or typing_type is Any:
        return default
    mod = getattr(typing_type, "__module__", "") or ""
    name = getattr(typing_type, "__name__", "") or ""
    if mod.startswith("pyarrow") and name == "Table":
        return "arrow"
    if mod.startswith("polars"):
        return "polars"
    if mod.startswith("pandas"):
        return "pandas"
    origin = getattr(typing_type, "__origin__", typing_type)
    if origin is list:
        return "records"
    if origin is dict:
        return "pydict"
    return default


class NoetlTableIOManager(dg.ConfigurableIOManager):
    """Base: the format-specific subclasses set ``table_format`` and write options."""

    table_format: ClassVar[str] = "parquet"

    registry: NoetlRegistryResource = Field(
        default_factory=NoetlRegistryResource, description="the NoETL registry every version is recorded in"
    )
    store_url: str | None = Field(
        default=None,
        description="payload store for table files: a directory, file:///dir, s3://bucket/prefix?endpoint_url=..., "
        "gs://bucket/prefix or azure://container/prefix (docs/storage.md) "
        "(default: $NOETL_DAGSTER_HOME/tables)",
    )
    namespace: str = Field(default="assets", description="namespace for assets whose key does not name one")
    resource_type: str = Field(default="dataset", description="resource type in the noetl:// URI")
    region: str = Field(default="local", description="region recorded on locations and preferred on reads")
    load_as: str = Field(
        default="arrow", description=f"type returned for unannotated inputs: {', '.join(AS_TYPES)}"
    )
    checksum_algorithm: str = Field(
        default="",
        description="checksum of written files: sha256 or blake3 (about 4x faster to compute; a table write"
        " costs ~1.1x a plain pyarrow write instead of ~1.4x); empty: $NOETL_CHECKSUM_ALGORITHM, else sha256",
    )

    @field_validator("checksum_algorithm")
    @classmethod
    def _known_checksum(cls, v: str) -> str:
        try:
            return checksum_algorithm(v) if v else ""
        except ValueError:  # said with the field's name, as the launchpad shows it
            raise ValueError(
                f"checksum_algorithm {v!r} is not one of: {', '.join(CHECKSUM_ALGORITHMS)} (or empty)"
            ) from None

    _storage: TableStorage | None = PrivateAttr(default=None)

    # ----------------------------------------------------------------- plumbing
    def storage(self) -> TableStorage:
        if self._storage is None:
            self._storage = TableStorage(
                self.registry.get_client(),
                self.store_url or None,
                iceberg=self._iceberg(),
                region=self.region,
            )
        return self._storage

    def _iceberg(self) -> Any:
        return None

    def _write_options(self, context: dg.OutputContext) -> dict[str, Any]:
        return {}

    @staticmethod
    def _meta(context: dg.OutputContext | dg.InputContext, key: str, *, runtime: bool = True) -> Any:
        """A metadata value: runtime output metadata first, then the definition's."""
        sources = [context.definition_metadata]
        if runtime and isinstance(context, dg.OutputContext):
            sources.insert(0, context.output_metadata)
        for source in sources:
            if source and key in source:
                value = source[key]
                return getattr(value, "value", value)
        return None

    def uri_for_asset(
        self, asset_key: dg.AssetKey, metadata_uri: str | None = None, rtype: str | None = None
    ) -> str:
        """The unversioned noetl:// URI of an asset (see the module docstring)."""
        if metadata_uri:
            return parse_locator(metadata_uri, require_version=False).unversioned().uri
        tenant, project = self.registry.scope()
        path = list(asset_key.path)
        rtype = rtype or self.resource_type
        try:
            if len(path) >= 4 and path[0] == tenant and path[1] == project:
                return ResourceLocator(tenant, project, path[2], rtype, "/".join(path[3:])).uri
            return ResourceLocator(tenant, project, self.namespace, rtype, "/".join(path)).uri
        except InvalidLocator as e:
            raise dg.DagsterInvariantViolationError(
                f"asset {asset_key.to_user_string()} cannot name a noetl:// resource ({e}); "
                f"set metadata {{'{META_URI}': 'noetl://…'}} on it"
            ) from e

    def _output_uri(self, context: dg.OutputContext, *, runtime: bool = True) -> str:
        rtype = self._meta(context, META_TYPE, runtime=runtime)
        if context.has_asset_key:
            return self.uri_for_asset(
                context.asset_key, self._meta(context, META_URI, runtime=runtime), rtype
            )
        explicit = self._meta(context, META_URI, runtime=runtime)
        if explicit:
            return parse_locator(explicit, require_version=False).unversioned().uri
        tenant, project = self.registry.scope()
        name = f"runs/{_safe_segment(context.run_id)}/{_safe_segment(context.step_key)}/{_safe_segment(context.name)}"
        return ResourceLocator(tenant, project, self.namespace, rtype or self.resource_type, name).uri

    @staticmethod
    def _execution_id(context: dg.OutputContext | dg.InputContext) -> str | None:
        try:
            tags = context.step_context.run_tags
        except Exception:  # noqa: BLE001 - contexts built outside a run have no step context
            return None
        return tags.get("noetl/execution_id") or context.step_context.run_id

    # ----------------------------------------------------------------- outputs
    def handle_output(self, context: dg.OutputContext, obj: Any) -> None:
        if obj is None:
            return
        uri = self._output_uri(context)
        inputs = list(self._meta(context, META_INPUTS) or [])
        if context.step_key:
            inputs += _take_loaded(context.run_id, context.step_key)
        inputs += self._unloaded_deps(context, inputs)
        pub = self.storage().publish(
            obj,
            uri,
            format=self.table_format,
            inputs=dict.fromkeys(inputs),
            metadata={
                "dagster/asset_key": context.asset_key.to_user_string() if context.has_asset_key else None,
                "dagster/run_id": context.run_id,
            },
            execution_id=self._execution_id(context),
            step=context.step_key,
            task=context.name,
            checksum=self.checksum_algorithm or None,
            **self._write_options(context),
        )
        ref = pub.ref()
        meta: dict[str, Any] = {
            "dagster/row_count": dg.MetadataValue.int(ref["rows"]),
            "dagster/column_schema": dg.TableSchema(  # the same shape the playbook assets report (translator/versions.py)
                columns=[
                    dg.TableColumn(
                        c["name"],
                        c["type"],
                        constraints=dg.TableColumnConstraints(nullable=bool(c.get("nullable", True))),
                    )
                    for c in pub.write.columns
                ]
            ),
            "noetl/uri": dg.MetadataValue.text(ref["uri"]),
            "noetl/urn": dg.MetadataValue.text(ref["urn"]),
            "noetl/version": dg.MetadataValue.text(ref["version"]),
            "noetl/resource_id": dg.MetadataValue.text(ref["resource_id"]),
            "noetl/checksum": dg.MetadataValue.text(ref["checksum"]),
            "noetl/format": dg.MetadataValue.text(ref["format"]),
            "noetl/location": dg.MetadataValue.text(ref["location"]),
            "noetl/schema_fingerprint": dg.MetadataValue.text(ref["schema_fingerprint"]),
        }
        if ref.get("size") is not None:
            meta["noetl/size_bytes"] = dg.MetadataValue.int(ref["size"])
        if pub.resource.locations and pub.resource.locations[0].metadata.get("snapshot_id") is not None:
            meta["noetl/iceberg_snapshot_id"] = dg.MetadataValue.int(ref["snapshot_id"])
            meta["dagster/table_name"] = dg.MetadataValue.text(".".join(pub.write.metadata["identifier"]))
        if inputs:
            meta["noetl/inputs"] = dg.MetadataValue.json(list(dict.fromkeys(inputs)))
        context.add_output_metadata(meta)

    def _unloaded_deps(self, context: dg.OutputContext, already: list[str]) -> list[str]:
        """Upstream assets this step did not load through us (non-argument deps): their newest version."""
        if not context.has_asset_key:
            return []
        try:
            deps = [d.asset_key for d in context.asset_spec.deps]
        except Exception:  # noqa: BLE001 - op outputs without a spec
            return []
        seen = {parse_locator(u, require_version=False).series for u in already}
        found = []
        client = self.registry.get_client()
        for key in deps:
            try:
                uri = self.uri_for_asset(key)
                if uri in seen:
                    continue
                found.append(client.resolve(uri).uri)
            except (RegistryError, dg.DagsterInvariantViolationError):
                continue  # not a registry-backed asset, or not readable: no lineage edge
        return found

    # ------------------------------------------------------------------ inputs
    def _input_uri(self, context: dg.InputContext) -> str:
        pinned = self._meta(context, META_VERSION)
        explicit = self._meta(context, META_URI)
        if context.has_asset_key:
            upstream_meta = None
            if context.upstream_output is not None:
                upstream_meta = (context.upstream_output.definition_metadata or {}).get(META_URI)
                upstream_meta = getattr(upstream_meta, "value", upstream_meta)
            base = self.uri_for_asset(context.asset_key, explicit or upstream_meta)
        elif context.upstream_output is not None:
            # an upstream output seen from an input has no runtime metadata (dagster#20094)
            base = self._output_uri(context.upstream_output, runtime=False)
        elif explicit:
            base = explicit
        else:
            raise dg.DagsterInvariantViolationError(f"input {context.name}: no asset key and no '{META_URI}'")
        loc = parse_locator(base, require_version=False)
        if pinned:
            loc = loc.with_version(str(pinned))
        return loc.uri

    def load_input(self, context: dg.InputContext) -> Any:
        uri = self._input_uri(context)
        storage = self.storage()
        plan = storage.registry.resolve(uri, purpose="read", region=self.region)
        table = storage.read_plan(plan)
        typing_type = getattr(context.dagster_type, "typing_type", None)
        value = convert(table, _as_type_for(typing_type, self.load_as))
        step_context = getattr(context, "step_context", None)
        if step_context is not None:
            _remember_loaded(step_context.run_id, step_context.step.key, plan.uri)
        context.add_input_metadata(
            {
                "noetl/uri": dg.MetadataValue.text(plan.uri),
                "noetl/checksum": dg.MetadataValue.text(plan.expected_checksum or ""),
                "dagster/row_count": dg.MetadataValue.int(table.num_rows),
            }
        )
        return value
