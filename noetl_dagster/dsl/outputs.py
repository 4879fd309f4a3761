"""What a playbook produces, for the asset catalog: step ``outputs`` and ``executor.spec.dagster``.

Parsed and validated with the rest of the document (``dsl.parse``), each error with
its file, line and rule; the translator turns them into Dagster assets, asset checks,
partitions and automation (docs/dagster.md, "Asset-first").
"""

from __future__ import annotations

import re
from datetime import datetime
from typing import Any, Protocol

from noetl_dagster.dsl.locator import InvalidLocator, parse_locator
from noetl_dagster.dsl.model import Output, OutputCheck
from noetl_dagster.dsl.source import PathT

OUTPUT_KEYS = {"uri", "description", "owners", "kinds", "tags", "group", "automation", "freshness", "checks"}
CHECK_KINDS = ("row_count", "schema", "freshness", "assert")
CHECK_KEYS = {*CHECK_KINDS, "name", "severity", "blocking", "description"}
DAGSTER_KEYS = {"mode", "partitions", "automation", "freshness", "owners", "group"}
TIME_PARTITIONS = ("daily", "hourly", "weekly", "monthly")
PARTITION_KEYS = {
    *TIME_PARTITIONS,
    "static",
    "workload_key",
    "timezone",
    "end_offset",
    "backfill",
    "range_key",
}
AUTOMATIONS = ("eager", "on_missing")
OWNER_RE = re.compile(r"^(team:[A-Za-z0-9_.-]+|[^@\s]+@[^@\s]+\.[^@\s]+)$")
NAME_RE = re.compile(r"^[A-Za-z0-9_]+$")


class _Ctx(Protocol):
    def err(self, path: PathT, rule: str, message: str) -> None: ...


def parse_outputs(ctx: _Ctx, raw: Any, path: PathT, line_of: Any) -> list[Output]:
    """``outputs:`` of a step: a list of ``noetl://`` URIs or mappings ``{uri, checks, owners, ...}``."""
    if not isinstance(raw, list):
        ctx.err(
            path, "outputs-shape", "`outputs` must be a list of noetl:// URIs or {uri: ..., ...} mappings"
        )
        return []
    out: list[Output] = []
    for i, item in enumerate(raw):
        ip = (*path, i)
        if isinstance(item, str):
            item = {"uri": item}
        if not isinstance(item, dict):
            ctx.err(ip, "outputs-shape", "an output is a noetl:// URI or a mapping with `uri`")
            continue
        unknown = sorted(str(k) for k in item if k not in OUTPUT_KEYS)
        if unknown:
            ctx.err(
                (*ip, unknown[0]), "output-key", f"unknown output key(s) {unknown}; use {sorted(OUTPUT_KEYS)}"
            )
            continue
        if not _uri_ok(ctx, item.get("uri"), (*ip, "uri")):
            continue
        ok = _owners_ok(ctx, item.get("owners"), (*ip, "owners"))
        ok &= _str_list_ok(ctx, item.get("kinds"), (*ip, "kinds"), "output-kinds")
        tags = item.get("tags")
        if tags is not None and not (
            isinstance(tags, dict) and all(isinstance(v, str) for v in tags.values())
        ):
            ctx.err((*ip, "tags"), "output-tags", "`tags` must be a mapping of strings")
            ok = False
        ok &= _automation_ok(ctx, item.get("automation"), (*ip, "automation"))
        ok &= _freshness_ok(ctx, item.get("freshness"), (*ip, "freshness"))
        checks = _parse_checks(ctx, item.get("checks"), (*ip, "checks"))
        if not ok or checks is None:
            continue
        out.append(
            Output(**{k: v for k, v in item.items() if k != "checks"}, checks=checks, line=line_of(ip))
        )
    return out


def _uri_ok(ctx: _Ctx, uri: Any, path: PathT) -> bool:
    if not isinstance(uri, str) or "{{" in uri:
        ctx.err(
            path, "output-uri", "an output needs a literal `uri: noetl://tenant/project/namespace/type/name`"
        )
        return False
    try:
        loc = parse_locator(uri, require_version=False)
    except InvalidLocator as e:
        ctx.err(path, "output-uri", str(e))
        return False
    if loc.version:
        ctx.err(path, "output-uri", f"an output names a table, not a version: drop `@{loc.version}`")
        return False
    return True


def _owners_ok(ctx: _Ctx, owners: Any, path: PathT) -> bool:
    if not _str_list_ok(ctx, owners, path, "output-owners"):
        return False
    bad = [o for o in owners or [] if not OWNER_RE.match(o)]
    if bad:
        ctx.err(path, "output-owners", f"owner {bad[0]!r} is neither an email nor team:<name>")
        return False
    return True


def _str_list_ok(ctx: _Ctx, value: Any, path: PathT, rule: str) -> bool:
    if value is not None and not (isinstance(value, list) and all(isinstance(v, str) and v for v in value)):
        ctx.err(path, rule, "must be a list of strings")
        return False
    return True


def _parse_checks(ctx: _Ctx, raw: Any, path: PathT) -> list[OutputCheck] | None:
    if raw is None:
        return []
    if not isinstance(raw, list):
        ctx.err(path, "check-shape", "`checks` must be a list")
        return None
    out: list[OutputCheck] = []
    names: set[str] = set()
    for j, c in enumerate(raw):
        cp = (*path, j)
        if not isinstance(c, dict):
            ctx.err(cp, "check-shape", f"a check is a mapping with one of {list(CHECK_KINDS)}")
            return None
        kinds = [k for k in CHECK_KINDS if k in c]
        unknown = sorted(str(k) for k in c if k not in CHECK_KEYS)
        if unknown or len(kinds) != 1:
            what = f"unknown key(s) {unknown}" if unknown else f"found {kinds or 'none'}"
            ctx.err(cp, "check-shape", f"a check has exactly one of {list(CHECK_KINDS)} ({what})")
            return None
        kind = kinds[0]
        if not _check_body_ok(ctx, kind, c[kind], (*cp, kind)):
            return None
        name = c.get("name") or default_check_name(kind, j)
        if not isinstance(name, str) or not NAME_RE.match(name) or name in names:
            ctx.err(
                (*cp, "name"),
                "check-name",
                f"check name {name!r} must match [A-Za-z0-9_]+ and be unique per output",
            )
            return None
        if c.get("severity", "error") not in ("error", "warn") or not isinstance(
            c.get("blocking", False), bool
        ):
            ctx.err(cp, "check-shape", "`severity` is error or warn, `blocking` true or false")
            return None
        names.add(name)
        out.append(OutputCheck(**{**c, "name": name}))
    return out


def default_check_name(kind: str, index: int) -> str:
    return {"row_count": "row_count", "schema": "schema_drift", "freshness": "freshness"}.get(
        kind, f"assert_{index}"
    )


def _check_body_ok(ctx: _Ctx, kind: str, body: Any, path: PathT) -> bool:
    if kind == "assert":
        if not isinstance(body, str) or "{{" not in body:
            ctx.err(path, "check-assert", "`assert` is a template predicate, e.g. '{{ output.rows >= 10 }}'")
            return False
        return True
    if kind == "row_count":
        if not (isinstance(body, dict) and body and set(body) <= {"min", "max"}
                and all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in body.values())):  # fmt: skip
            ctx.err(path, "check-row-count", "`row_count` is {min: N, max: M} (non-negative integers)")
            return False
        return True
    if kind == "schema":
        cols = body.get("columns") if isinstance(body, dict) else None
        if not (isinstance(body, dict) and body and set(body) <= {"columns", "stable"}
                and isinstance(body.get("stable", True), bool)
                and (cols is None or (isinstance(cols, dict) and all(isinstance(v, str) for v in cols.values())))):  # fmt: skip
            ctx.err(path, "check-schema", "`schema` is {columns: {name: arrow type}, stable: true|false}")
            return False
        return True
    if not (
        isinstance(body, dict) and set(body) == {"max_age_minutes"} and _positive(body["max_age_minutes"])
    ):
        ctx.err(path, "check-freshness", "`freshness` is {max_age_minutes: N}")
        return False
    return True


def _positive(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0


def _automation_ok(ctx: _Ctx, raw: Any, path: PathT) -> bool:
    if raw is None or raw in AUTOMATIONS:
        return True
    if isinstance(raw, dict) and set(raw) <= {"on_cron", "timezone"} and _cron_ok(raw.get("on_cron")):
        return True
    ctx.err(
        path, "automation", "`automation` is eager, on_missing or {on_cron: '<cron>', timezone: <IANA name>}"
    )
    return False


def _cron_ok(v: Any) -> bool:
    return isinstance(v, str) and len(v.split()) == 5


def _freshness_ok(ctx: _Ctx, raw: Any, path: PathT) -> bool:
    if raw is None:
        return True
    if (
        isinstance(raw, dict)
        and set(raw) <= {"fail_after_minutes", "warn_after_minutes"}
        and _positive(raw.get("fail_after_minutes"))
    ):
        warn = raw.get("warn_after_minutes")
        if warn is None or (_positive(warn) and warn < raw["fail_after_minutes"]):
            return True
    if (isinstance(raw, dict) and set(raw) <= {"deadline_cron", "lower_bound_minutes", "timezone"}
            and _cron_ok(raw.get("deadline_cron")) and _positive(raw.get("lower_bound_minutes"))):  # fmt: skip
        return True
    ctx.err(path, "freshness", "`freshness` is {fail_after_minutes: N[, warn_after_minutes: M < N]} or "
            "{deadline_cron: '<cron>', lower_bound_minutes: N[, timezone]}")  # fmt: skip
    return False


def check_dagster_spec(ctx: _Ctx, executor_spec: Any, workload: dict[str, Any]) -> None:
    """``executor.spec.dagster``: mode, partitions, automation, freshness, owners, group."""
    raw = executor_spec.get("dagster") if isinstance(executor_spec, dict) else None
    path: PathT = ("executor", "spec", "dagster")
    if raw is None:
        return
    if not isinstance(raw, dict):
        ctx.err(path, "dagster-spec", "`executor.spec.dagster` must be a mapping")
        return
    for k in sorted(str(k) for k in raw if k not in DAGSTER_KEYS):
        ctx.err((*path, k), "dagster-spec-key", f"unknown key {k!r}; use {sorted(DAGSTER_KEYS)}")
    if raw.get("mode") not in (None, "default", "per_step"):
        ctx.err((*path, "mode"), "dagster-mode", "`mode` is default or per_step")
    _owners_ok(ctx, raw.get("owners"), (*path, "owners"))
    if raw.get("group") is not None and not (isinstance(raw["group"], str) and NAME_RE.match(raw["group"])):
        ctx.err((*path, "group"), "dagster-group", "`group` must match [A-Za-z0-9_]+")
    _automation_ok(ctx, raw.get("automation"), (*path, "automation"))
    _freshness_ok(ctx, raw.get("freshness"), (*path, "freshness"))
    if raw.get("partitions") is not None:
        _partitions_ok(ctx, raw["partitions"], (*path, "partitions"), workload)


def _partitions_ok(ctx: _Ctx, raw: Any, path: PathT, workload: dict[str, Any]) -> None:
    if not isinstance(raw, dict):
        ctx.err(path, "partitions", "`partitions` must be a mapping")
        return
    unknown = sorted(str(k) for k in raw if k not in PARTITION_KEYS)
    kinds = [k for k in (*TIME_PARTITIONS, "static") if k in raw]
    if unknown or len(kinds) != 1:
        ctx.err(path, "partitions", f"`partitions` has one of {[*TIME_PARTITIONS, 'static']} and `workload_key`"
                + (f"; unknown key(s) {unknown}" if unknown else ""))  # fmt: skip
        return
    key = raw.get("workload_key")
    if not isinstance(key, str) or not key:
        ctx.err(
            (*path, "workload_key"),
            "partitions",
            "`workload_key` names the workload value a partition key sets",
        )
    kind = kinds[0]
    value = raw[kind]
    if kind == "static":
        values = workload.get(value) if isinstance(value, str) else value
        if not (isinstance(values, list) and values and all(isinstance(v, str) and v for v in values)
                and len(set(values)) == len(values)):  # fmt: skip
            ctx.err((*path, "static"), "partitions", "`static` is a list of distinct strings, or the name of a "
                    "workload key holding one")  # fmt: skip
    else:
        try:
            datetime.fromisoformat(str(value))
        except ValueError:
            ctx.err(
                (*path, kind),
                "partitions",
                f"`{kind}` is the first partition's start date (YYYY-MM-DD), not {value!r}",
            )
    if not isinstance(raw.get("end_offset", 0), int):
        ctx.err((*path, "end_offset"), "partitions", "`end_offset` must be an integer")
    backfill = raw.get("backfill")
    if (
        backfill is not None
        and backfill not in ("single_run", "multi_run")
        and not (isinstance(backfill, int) and not isinstance(backfill, bool) and backfill >= 1)
    ):
        ctx.err((*path, "backfill"), "partitions", "`backfill` is single_run, multi_run or the most partitions per run "
                f"(an integer >= 1), not {backfill!r}")  # fmt: skip
    rk = raw.get("range_key")
    if rk is not None and not (isinstance(rk, str) and rk and rk != key):
        ctx.err((*path, "range_key"), "partitions", "`range_key` names the workload value a run's partition keys "
                "(a list) land in; it differs from `workload_key`")  # fmt: skip
