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
    repo = Path(__file__).resolve().parents[1]
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
        schemas = [json.loads(p.read_text()) for p in [root, *sorted((self.spec_dir / "facets").glob("*.json"))]]
        self.schemas = {s["$id"]: s for s in schemas}
        self.registry: Registry = Registry().with_resources(
            (sid, Resource.from_contents(s, default_specification=DRAFT202012)) for sid, s in self.schemas.items()
        )
        self.root_schema = schemas[0]
        self.format_checker = _format_checker()
        self._event = Draft202012Validator(self.root_schema, registry=self.registry, format_checker=self.format_checker)
        # the root is a oneOf of event kinds: for a readable reason, also check the RunEvent branch alone
        self._run_event = Draft202012Validator(
            {"$ref": f"{self.root_schema['$id']}#/$defs/RunEvent"}, registry=self.registry,
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
                errors.append(f"{where}.{key}: the facet file {base} names its facet {sorted(props)}, not {key!r}")
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
                detail = [f"event: {e.message} at {list(e.absolute_path)}" for e in self._run_event.iter_errors(event)]
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
