"""Offline validation of OpenLineage events against the spec's JSON Schemas.

The event must validate against ``OpenLineage.json``; every facet against the
schema its ``_schemaURL`` names (resolved locally from the facet files, never
fetched), under a key the facet file defines. Formats (uuid, date-time, uri)
are checked.

The spec directory is ``$OPENLINEAGE_SPEC_DIR`` or, next to this repository,
``../shared/reference/openlineage-spec/spec``.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import jsonschema
from jsonschema import Draft202012Validator, FormatChecker
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012

_URI = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:[^\s]*$")


class SpecNotFound(FileNotFoundError):
    pass


def default_spec_dir() -> Path:
    env = os.environ.get("OPENLINEAGE_SPEC_DIR")
    if env:
        return Path(env)
    repo = Path(__file__).resolve().parents[2]  # lineage/noetl_lineage/validate.py
    return repo.parent / "shared" / "reference" / "openlineage-spec" / "spec"


def _format_checker() -> FormatChecker:
    checker = FormatChecker()

    @checker.checks("uri")
    def _is_uri(value: object) -> bool:  # jsonschema has no uri checker without an extra package
        return not isinstance(value, str) or bool(_URI.match(value))

    return checker


class LineageValidator:
    def __init__(self, spec_dir: str | os.PathLike[str] | None = None):
        self.spec_dir = Path(spec_dir) if spec_dir else default_spec_dir()
        root = self.spec_dir / "OpenLineage.json"
        if not root.is_file():
            raise SpecNotFound(
                f"OpenLineage spec not found at {root}; set OPENLINEAGE_SPEC_DIR to the spec/ directory"
            )
        # plus the custom facets noetl-dagster emits (lineage/noetl_lineage/facets/, e.g. noetl_quantum)
        own = sorted((Path(__file__).parent / "facets").glob("*.json"))
        schemas = [
            json.loads(p.read_text())
            for p in [root, *sorted((self.spec_dir / "facets").glob("*.json")), *own]
        ]
        self.schemas = {s["$id"]: s for s in schemas}
        self.registry: Registry = Registry().with_resources(
            (sid, Resource.from_contents(s, default_specification=DRAFT202012))
            for sid, s in self.schemas.items()
        )
        self.root_schema = schemas[0]
        self.format_checker = _format_checker()
        self._event = Draft202012Validator(
            self.root_schema, registry=self.registry, format_checker=self.format_checker
        )
        # the root is a oneOf of event kinds: for a readable reason, also check the RunEvent branch alone
        self._run_event = Draft202012Validator(
            {"$ref": f"{self.root_schema['$id']}#/$defs/RunEvent"},
            registry=self.registry,
            format_checker=self.format_checker,
        )

    def _facet_errors(self, where: str, facets: Any) -> list[str]:
        if facets is None:
            return []
        if not isinstance(facets, dict):
            return [f"{where}: facets must be an object"]
        errors = []
        for key, facet in facets.items():
            url = facet.get("_schemaURL") if isinstance(facet, dict) else None
            if not url:
                errors.append(f"{where}.{key}: no _schemaURL")
                continue
            base, _, pointer = url.partition("#")
            if base not in self.schemas:
                errors.append(f"{where}.{key}: schema {base} is not in the local spec")
                continue
            file_schema = self.schemas[base]
            props = file_schema.get("properties") or {}
            if base != self.root_schema["$id"] and key not in props:
                errors.append(
                    f"{where}.{key}: the facet file {base} names its facet {sorted(props)}, not {key!r}"
                )
            try:
                sub = self.registry.resolver(base_uri=base).lookup(url).contents
            except Exception as e:  # noqa: BLE001 - report the unresolvable pointer
                errors.append(f"{where}.{key}: cannot resolve {url}: {e}")
                continue
            validator = Draft202012Validator(
                {"$id": base, "$defs": file_schema.get("$defs", {}), **sub} if pointer else file_schema,
                registry=self.registry,
                format_checker=self.format_checker,
            )
            errors.extend(f"{where}.{key}: {err.message}" for err in validator.iter_errors(facet))
        return errors

    def errors(self, event: dict[str, Any]) -> list[str]:
        errors = [f"event: {e.message} at {list(e.absolute_path)}" for e in self._event.iter_errors(event)]
        if errors:
            if isinstance(event, dict) and "run" in event:
                detail = [
                    f"event: {e.message} at {list(e.absolute_path)}"
                    for e in self._run_event.iter_errors(event)
                ]
                return detail or errors
            return errors
        errors += self._facet_errors("run.facets", (event.get("run") or {}).get("facets"))
        errors += self._facet_errors("job.facets", (event.get("job") or {}).get("facets"))
        for side, extra in (("inputs", "inputFacets"), ("outputs", "outputFacets")):
            for i, ds in enumerate(event.get(side) or []):
                errors += self._facet_errors(f"{side}[{i}].facets", ds.get("facets"))
                errors += self._facet_errors(f"{side}[{i}].{extra}", ds.get(extra))
        return errors

    def validate(self, event: dict[str, Any]) -> None:
        errors = self.errors(event)
        if errors:
            raise jsonschema.ValidationError("; ".join(errors))


TERMINAL = ("COMPLETE", "FAIL", "ABORT")


def semantic_errors(events: list[dict[str, Any]]) -> list[str]:
    """Rules across events that a schema cannot express (what OpenLineage's
    compatibility tests check of a producer's stream):

    - a run starts with START and ends with exactly one terminal event (COMPLETE,
      FAIL or ABORT), with nothing after it, and its event times never go back;
    - a run keeps one job identity (namespace and name) from START to the end;
    - a ``parent`` facet (and its ``root``) points at a run that is in the stream,
      under the job that run reported, and that run started no later than the child;
    - a dataset keeps one identity: its ``dataSource`` and storage format do not
      change between events, and its name is stable (no stray whitespace or
      trailing separators).
    """
    errors: list[str] = []
    runs: dict[str, dict[str, Any]] = {}
    for i, ev in enumerate(events):
        run_id = (ev.get("run") or {}).get("runId")
        job = ev.get("job") or {}
        ident = (job.get("namespace"), job.get("name"))
        kind = ev.get("eventType")
        when = ev.get("eventTime") or ""
        r = runs.get(run_id)
        if r is None:
            r = runs[run_id] = {
                "job": ident,
                "first": kind,
                "start": when,
                "last_time": when,
                "ended": None,
                "index": i,
            }
            if kind != "START":
                errors.append(f"event {i}: run {run_id} begins with {kind}, not START")
        else:
            if r["ended"] is not None:
                errors.append(f"event {i}: run {run_id} has a {kind} event after its {r['ended']}")
            if ident != r["job"]:
                errors.append(f"event {i}: run {run_id} changed job from {r['job']} to {ident}")
            if kind == "START":
                errors.append(f"event {i}: run {run_id} starts twice")
            if when and r["last_time"] and when < r["last_time"]:
                errors.append(f"event {i}: run {run_id} goes back in time ({when} < {r['last_time']})")
        if when:
            r["last_time"] = max(r["last_time"] or when, when)
        if kind in TERMINAL and r["ended"] is None:
            r["ended"] = kind
    for run_id, r in runs.items():
        if r["ended"] is None:
            errors.append(f"run {run_id} ({r['job'][1]}) never ends (no COMPLETE, FAIL or ABORT)")
    for i, ev in enumerate(events):
        parent = ((ev.get("run") or {}).get("facets") or {}).get("parent")
        if not isinstance(parent, dict):
            continue
        child = (ev.get("run") or {}).get("runId")
        links = [("parent", parent.get("run"), parent.get("job"))]
        root = parent.get("root")
        if isinstance(root, dict):
            links.append(("root", root.get("run"), root.get("job")))
        for what, run, job in links:
            pid = (run or {}).get("runId")
            target = runs.get(pid)
            if target is None:
                errors.append(f"event {i}: {what} run {pid} of run {child} is not in the stream")
                continue
            if ((job or {}).get("namespace"), (job or {}).get("name")) != target["job"]:
                errors.append(f"event {i}: {what} job {job} of run {child} is not the job run {pid} reported")
            if target["index"] > runs[child]["index"]:
                errors.append(f"event {i}: {what} run {pid} starts after its child run {child}")
    datasets: dict[tuple[str, str], dict[str, Any]] = {}
    for i, ev in enumerate(events):
        for side in ("inputs", "outputs"):
            for ds in ev.get(side) or []:
                key = (ds.get("namespace"), ds.get("name"))
                name = key[1] or ""
                if name != name.strip() or (len(name) > 1 and name.endswith("/")):
                    errors.append(
                        f"event {i}: dataset name {name!r} is not stable (whitespace or a trailing '/')"
                    )
                facets = ds.get("facets") or {}
                seen = {
                    "dataSource": (facets.get("dataSource") or {}).get("uri"),
                    "fileFormat": (facets.get("storage") or {}).get("fileFormat"),
                }
                known = datasets.setdefault(key, {})
                for attr, value in seen.items():
                    if value is None:
                        continue
                    if known.setdefault(attr, value) != value:
                        errors.append(
                            f"event {i}: dataset {key} changed {attr} from {known[attr]!r} to {value!r}"
                        )
    return errors
