"""Helpers for the Dagster tests (imported by name: `from dagster_helpers import ...`): run a playbook through both runners and compare.

The event log is the only record that counts: equivalence is checked on the
``--json`` summary (minus ids) and on the sequence of event names of every
step (per loop iteration, since parallel iterations interleave by design).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import dagster as dg
import httpx

from noetl_dagster.runners.local import run_playbook
from noetl_dagster.storage.event_stores import open_event_store
from noetl_dagster.translator.runner import run_playbook_dagster

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "example_project" / "playbooks"
SHARED = Path(os.environ.get("NOETL_SHARED", REPO.parent / "shared"))
FIXTURES = SHARED / "conformance" / "noetl-e2e" / "fixtures" / "playbooks"


# ids of this run and its sub-playbooks; HTTP Date headers; ids the registry and the object store mint
VOLATILE_KEYS = {"execution_id", "date", "resource_id", "location"}


def strip_ids(value: Any, ids: set[str]) -> Any:
    """Drop what differs between two runs of one playbook by nature (ids, clock headers)."""
    if isinstance(value, dict):
        return {k: strip_ids(v, ids) for k, v in value.items() if k.lower() not in VOLATILE_KEYS}
    if isinstance(value, list):
        return [strip_ids(v, ids) for v in value]
    if isinstance(value, str) and value in ids:
        return "<execution_id>"
    return value


def summary(result: Any) -> dict[str, Any]:
    j = result.to_json()
    return strip_ids(j, {j["execution_id"]})


def names_per_step(events: list[Any]) -> dict[tuple[str | None, int | None], list[str]]:
    """Event names grouped by (step, loop iteration), in log order."""
    out: dict[tuple[str | None, int | None], list[str]] = defaultdict(list)
    for ev in events:
        out[(ev.step, ev.iteration)].append(ev.name)
    return dict(out)


def events_of(data_dir: Path, execution_id: str) -> list[Any]:
    store = open_event_store(None, data_dir=data_dir)
    try:
        return store.read(execution_id)
    finally:
        store.close()


def scope_of(path: Path) -> dict[str, str]:
    """The example playbooks run as the example project's tenant/project (its tables live there)."""
    return {"tenant": "demo", "project": "examples"} if path.parent == EXAMPLES else {}


def run_local(path: Path, data_dir: Path, workload: dict | None = None) -> Any:
    return run_playbook(path, workload, data_dir=data_dir, **scope_of(path))


def run_dagster(path: Path, data_dir: Path, instance: dg.DagsterInstance, mode: str = "default",
                workload: dict | None = None) -> Any:  # fmt: skip
    return run_playbook_dagster(
        path, workload, data_dir=data_dir, instance=instance, mode=mode, **scope_of(path)
    )


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def dagster_dev_server(
    module: str | None, *, cwd: Path, env: dict[str, str], log_path: Path
) -> Iterator[tuple[str, Any]]:
    """`dagster dev -m MODULE` (None: `dg dev` in the project folder ``cwd``) on a free port: yields
    (url, process) once /server_info answers; stops it with SIGINT (as a user would), SIGKILL only if
    it will not stop."""
    port = free_port()
    log = open(log_path, "wb")  # noqa: SIM115 - closed in finally, after the process
    bindir = Path(sys.executable).parent
    cmd = [str(bindir / "dagster"), "dev", "-m", module] if module else [str(bindir / "dg"), "dev"]
    proc = subprocess.Popen(
        [*cmd, "-h", "127.0.0.1", "-p", str(port)],
        cwd=cwd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 120
        while True:
            assert proc.poll() is None, log_path.read_text()[-3000:]
            try:
                if httpx.get(f"{url}/server_info", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.time() < deadline, "dagster dev did not answer /server_info in 120 s"
            time.sleep(0.5)
        yield url, proc
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGINT)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)
                raise AssertionError("dagster dev did not stop on SIGINT within 60 s") from None
        log.close()


def tables_of(result: Any) -> list[Any]:
    """A run's materialization events of tables: without the execution's cost summary (``noetl_cost/<job>``,
    translator/cost_summary.py), which every run that finishes an execution materializes."""
    return [
        e
        for e in result.get_asset_materialization_events()
        if e.materialization.asset_key.path[0] != "noetl_cost"
    ]
