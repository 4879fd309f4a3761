"""The conformance run over the NoETL e2e corpus.

For every playbook under the directory: does it parse (YAML → a mapping), is it
valid (``validate_file``: no issues, else the exact ``FILE:LINE: RULE: message``
lines). For the core fixtures (``core_fixtures.txt``): does it run to completion
here — each in its own ``noetl-dagster run --json`` process (a hung fixture is
killed at its timeout), with the stub servers of :mod:`.stubs` standing in for
the network, every stubbed host rewritten through the ``--http-override`` map
(in tool URLs via ``NOETL_HTTP_OVERRIDES``, and in the fixture's workload
values), and the ``pg_local`` / ``pg_k8s`` / ``pg_noetl_k8s`` credentials
pointing at a database of the local Postgres.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml

try:  # the C parser: the corpus is 160 files
    from yaml import CSafeLoader as _Loader
except ImportError:  # pragma: no cover
    from yaml import SafeLoader as _Loader  # type: ignore[assignment]

from noetl_dagster.conformance.corpus import PG_CREDENTIAL_NAMES, PG_PAYLOAD, FixtureSetup, fixture_setups
from noetl_dagster.conformance.stubs import StubSet
from noetl_dagster.dsl.loader import YamlSyntaxError, read_text_file
from noetl_dagster.tools.http import OVERRIDES_ENV, rewrite_url

DEFAULT_PG_URL = "postgresql://postgres@127.0.0.1:5432/noetl_conformance"

# Outcomes of a core fixture's run
COMPLETED, FAILED, INVALID, NOT_RUNNABLE, TIMEOUT, ERROR = (
    "completed",
    "failed",
    "invalid",
    "not runnable here",
    "timeout",
    "error",
)


@dataclass
class FixtureReport:
    path: str  # relative to the playbooks directory
    parsed: bool
    valid: bool
    errors: list[str] = field(default_factory=list)
    core: bool = False
    outcome: str | None = None  # for core fixtures
    reason: str = ""
    seconds: float | None = None
    execution_id: str | None = None
    note: str = ""


@dataclass
class ConformanceReport:
    directory: str
    started_at: str
    fixtures: list[FixtureReport]
    overrides: dict[str, str]
    database: str

    @property
    def totals(self) -> dict[str, Any]:
        core = [f for f in self.fixtures if f.core]
        by_outcome: dict[str, int] = {}
        for f in core:
            by_outcome[f.outcome or "?"] = by_outcome.get(f.outcome or "?", 0) + 1
        return {
            "playbooks": len(self.fixtures),
            "parsed": sum(f.parsed for f in self.fixtures),
            "valid": sum(f.valid for f in self.fixtures),
            "core": len(core),
            "core_completed": by_outcome.get(COMPLETED, 0),
            "core_outcomes": dict(sorted(by_outcome.items())),
        }

    def to_json(self) -> dict[str, Any]:
        return {
            "directory": self.directory,
            "started_at": self.started_at,
            "database": self.database,
            "overrides": self.overrides,
            "totals": self.totals,
            "fixtures": [asdict(f) for f in self.fixtures],
        }


def find_core_list(directory: Path) -> Path | None:
    for base in (directory, *directory.parents):
        cand = base / "core_fixtures.txt"
        if cand.is_file():
            return cand
    return None


def read_core_list(path: Path, directory: Path) -> list[str]:
    """Core fixture paths, relative to ``directory`` (the list names them from the corpus root)."""
    out = []
    for line in read_text_file(path, what="core fixture list").splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        full = (path.parent / line).resolve()
        try:
            out.append(str(full.relative_to(directory.resolve())))
        except ValueError:
            out.append(line)
    return out


def discover(directory: Path) -> list[str]:
    files = [p for p in directory.rglob("*") if p.suffix in (".yaml", ".yml") and p.is_file()]
    return sorted(str(p.relative_to(directory)) for p in files)


def check_file(directory: Path, rel: str) -> FixtureReport:
    from noetl_dagster.dsl import validate_file

    path = directory / rel
    try:
        doc = yaml.load(read_text_file(path), Loader=_Loader)
        parsed = isinstance(doc, dict)
    except (yaml.YAMLError, YamlSyntaxError):
        parsed = False
    issues = validate_file(path)
    prefix = str(directory) + os.sep  # errors name files relative to the corpus directory
    return FixtureReport(
        path=rel, parsed=parsed, valid=not issues, errors=[str(i).replace(prefix, "") for i in issues]
    )


def rewrite_workload_hosts(value: Any, overrides: Mapping[str, str]) -> Any:
    """The same value with every URL whose host is overridden pointed at its stub."""
    if isinstance(value, str) and "://" in value:
        return rewrite_url(value, overrides) if value.split("://", 1)[1].split("/", 1)[0] else value
    if isinstance(value, dict):
        return {k: rewrite_workload_hosts(v, overrides) for k, v in value.items()}
    if isinstance(value, list):
        return [rewrite_workload_hosts(v, overrides) for v in value]
    return value


def fixture_workload(path: Path, setup: FixtureSetup, overrides: Mapping[str, str]) -> dict[str, Any]:
    """The ``--workload`` for one fixture: the pg_local payload, rewritten hosts, then documented overrides."""
    doc = yaml.load(read_text_file(path), Loader=_Loader) or {}
    workload = doc.get("workload") if isinstance(doc, dict) else None
    workload = workload if isinstance(workload, dict) else {}
    out: dict[str, Any] = {}
    if "pg_auth" in workload:
        out.update(PG_PAYLOAD)
    for key, value in workload.items():
        rewritten = rewrite_workload_hosts(value, overrides)
        if rewritten != value:
            out[key] = rewritten
    out.update(setup.workload)
    return out


class PostgresTarget:
    """The local database the fixtures' Postgres credentials point at."""

    def __init__(self, url: str):
        from psycopg.conninfo import conninfo_to_dict

        self.url = url
        info = conninfo_to_dict(url)
        self.params = {
            "host": str(info.get("host") or "127.0.0.1"),
            "port": str(info.get("port") or "5432"),
            "user": str(info.get("user") or "postgres"),
            # libpq reads "password= dbname=x" as password "dbname=x": never hand fixtures an empty one
            "password": str(info.get("password") or "unchecked-by-trust-auth"),
            "dbname": str(info.get("dbname") or "noetl_conformance"),
        }

    def ensure_database(self) -> None:
        import psycopg

        admin = self.url.rsplit("/", 1)[0] + "/postgres"
        with psycopg.connect(admin, autocommit=True, connect_timeout=10) as conn:
            exists = conn.execute(
                "SELECT 1 FROM pg_database WHERE datname = %s", (self.params["dbname"],)
            ).fetchone()
            if not exists:
                conn.execute(f'CREATE DATABASE "{self.params["dbname"]}"')

    def run_sql(self, statements: list[str]) -> None:
        import psycopg

        with psycopg.connect(self.url, autocommit=True, connect_timeout=10) as conn:
            for stmt in statements:
                conn.execute(stmt)

    def credentials(self) -> dict[str, Any]:
        p = self.params
        record = {
            "type": "postgres",
            "data": {
                "db_host": p["host"],
                "db_port": p["port"],
                "db_user": p["user"],
                "db_password": p["password"],
                "db_name": p["dbname"],
            },
        }
        return {"credentials": {name: record for name in PG_CREDENTIAL_NAMES}}


def _first_error(results: Mapping[str, Any]) -> str:
    for step, res in results.items():
        if isinstance(res, dict) and res.get("status") == "error" and isinstance(res.get("error"), dict):
            err = res["error"]
            return f"step {step}: {err.get('kind')}: {err.get('message')}"
    return "failed (no step error recorded)"


def run_fixture(
    directory: Path,
    rel: str,
    workload: dict[str, Any],
    env: dict[str, str],
    work_dir: Path,
    timeout: float,
) -> tuple[str, str, float, str | None]:
    """(outcome, reason, seconds, execution_id) of one ``noetl-dagster run --json``."""
    data_dir = work_dir / rel.replace("/", "__")
    cmd = [
        sys.executable, "-m", "noetl_dagster.commands.main", "run", str(directory / rel), "--json", "--quiet",
        "--workload", json.dumps(workload), "--catalog", str(directory), "--data-dir", str(data_dir),
    ]  # fmt: skip
    started = time.perf_counter()
    try:
        proc = subprocess.run(
            cmd,
            capture_output=True,
            text=True,
            timeout=timeout,
            env={**env, "NOETL_DAGSTER_HOME": str(data_dir)},
        )
    except subprocess.TimeoutExpired:
        return TIMEOUT, f"did not finish within {timeout:.0f} s", time.perf_counter() - started, None
    seconds = time.perf_counter() - started
    if proc.returncode == 2:
        return INVALID, (proc.stderr.strip().splitlines() or ["invalid input"])[0], seconds, None
    try:
        out = json.loads(proc.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return ERROR, f"exit {proc.returncode}: {tail}", seconds, None
    if out.get("status") == "completed" and proc.returncode == 0:
        return COMPLETED, "", seconds, out.get("execution_id")
    return FAILED, _first_error(out.get("results") or {}), seconds, out.get("execution_id")


def _order(core: list[str], setups: Mapping[str, FixtureSetup]) -> list[str]:
    """Core fixtures in list order, each after the fixtures it names in ``after``."""
    done: list[str] = []

    def visit(rel: str, stack: tuple[str, ...]) -> None:
        if rel in done or rel in stack:
            return
        for dep in setups.get(rel, FixtureSetup()).after:
            if dep in core:
                visit(dep, (*stack, rel))
        done.append(rel)

    for rel in core:
        visit(rel, ())
    return done


def run_conformance(
    directory: str | os.PathLike[str],
    *,
    core_list: str | os.PathLike[str] | None = None,
    http_overrides: Mapping[str, str] | None = None,
    pg_url: str = DEFAULT_PG_URL,
    only: list[str] | None = None,
    run_core: bool = True,
    work_dir: str | os.PathLike[str] | None = None,
    progress: Callable[[FixtureReport], None] | None = None,
) -> ConformanceReport:
    directory = Path(directory).resolve()
    if not directory.is_dir():
        raise FileNotFoundError(f"{directory}: not a directory")
    core_path = Path(core_list) if core_list else find_core_list(directory)
    core = read_core_list(core_path, directory) if core_path else []
    started_at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())

    reports = {rel: check_file(directory, rel) for rel in discover(directory)}
    for rel in core:
        if rel in reports:
            reports[rel].core = True
        else:
            reports[rel] = FixtureReport(
                rel,
                parsed=False,
                valid=False,
                errors=[f"{rel}: listed in core_fixtures.txt but not found"],
                core=True,
                outcome=ERROR,
                reason="file not found",
            )

    target = PostgresTarget(pg_url)
    stubs = StubSet() if run_core else None
    try:
        overrides = {
            **(stubs.overrides if stubs else {}),
            **{k.lower(): v for k, v in (http_overrides or {}).items()},
        }
        if run_core:
            target.ensure_database()
            setups = fixture_setups(target.params)
            tmp = Path(work_dir) if work_dir else Path(tempfile.mkdtemp(prefix="noetl-conformance-"))
            tmp.mkdir(parents=True, exist_ok=True)
            creds = tmp / "credentials.json"
            creds.write_text(json.dumps(target.credentials()))
            env = {**os.environ, OVERRIDES_ENV: json.dumps(overrides), "NOETL_CREDENTIALS_FILE": str(creds)}
            for rel in _order(core, setups):
                rep = reports[rel]
                if only and not any(o in rel for o in only):
                    rep.outcome, rep.reason = "skipped", "not selected by --only"
                    continue
                setup = setups.get(rel, FixtureSetup())
                rep.note = setup.note
                if rep.outcome == ERROR:
                    pass
                elif setup.not_runnable:
                    rep.outcome, rep.reason = NOT_RUNNABLE, setup.not_runnable
                elif not rep.valid:
                    rep.outcome, rep.reason = INVALID, rep.errors[0] if rep.errors else "invalid"
                else:
                    if setup.seeds:
                        target.run_sql(setup.seeds)
                    workload = fixture_workload(directory / rel, setup, overrides)
                    rep.outcome, rep.reason, rep.seconds, rep.execution_id = run_fixture(
                        directory, rel, workload, env, tmp, setup.timeout
                    )
                if progress:
                    progress(rep)
    finally:
        if stubs:
            stubs.close()
    return ConformanceReport(
        directory=str(directory),
        started_at=started_at,
        fixtures=[reports[k] for k in sorted(reports)],
        overrides=overrides,
        database=_masked(pg_url),
    )


def _masked(url: str) -> str:
    from noetl_dagster.storage.postgres_events import masked

    return masked(url)
