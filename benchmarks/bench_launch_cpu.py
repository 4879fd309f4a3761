"""CPU on the way from a created run to its RUN_START (issue 35), in one process, against a toggle.

``bench_dagster_latency`` times the whole way through a real ``dagster dev``; on the shared 2-core
machine its wall times move with the other work. This one measures CPU seconds of the parts, in
one process, each variant interleaved with the other round by round, on a SQLite instance in a
temporary ``DAGSTER_HOME`` and the example code location:

* the daemon's part: ``NoetlRunCoordinator.submit_run`` of a created run (the queue's checks,
  ``instance.launch_run``: the STARTING event, which creates the run's event-log file, then a run
  launcher that only records the call), and the warm launcher's own reads and writes
  (the execution plan snapshot, the request, the run's tags);
* the run worker's part: a worker forked from a process that loaded the code location and opened
  the instance (what ``sensors.zygote`` does), up to its first event and up to RUN_START, from its
  own ``time.process_time`` (the parent's work before the fork is not counted);

each with the run storage's schema checks remembered (``zygote.cache_schema_checks``, the shipped
behaviour) and asked every time (Dagster as it is). Also the fork with ``gc.freeze()`` before it
(copy-on-write kept by the collector), which the measurement rejected.

Run: ``python -m benchmarks.bench_launch_cpu [--rounds 6] [--postgres]``.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
PG_ADMIN = "postgresql://postgres@127.0.0.1:5432/postgres"


def _toggle(storage: Any, wrapped: dict[str, Any], on: bool) -> None:
    for name, fn in wrapped.items():
        if on:
            storage.__dict__[name] = fn
        else:
            storage.__dict__.pop(name, None)


def _fork_worker(args: str, freeze: bool, event_log: type) -> dict[str, float]:
    """Fork one run worker (zygote.run_child); its CPU to its first event and to RUN_START."""
    from noetl_dagster.sensors import zygote

    if freeze:
        gc.freeze()
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the run worker
        os.close(r)
        marks: dict[str, float] = {}
        store = event_log.store_event

        def store_event(self: Any, event: Any) -> None:
            kind = event.dagster_event.event_type_value if event.dagster_event else "log"
            marks.setdefault(kind, time.process_time() - c0)
            store(self, event)

        event_log.store_event = store_event  # type: ignore[attr-defined]
        c0 = time.process_time()
        code = zygote.run_child(args)
        os.write(w, json.dumps(marks).encode())
        os.close(w)
        os._exit(code)
    os.close(w)
    _, status, ru = os.wait4(pid, 0)
    data = os.read(r, 65536)
    os.close(r)
    if freeze:
        gc.unfreeze()
    if status != 0:
        raise RuntimeError(f"run worker exited with {status}")
    marks = json.loads(data)
    return {"first_event": marks["ENGINE_EVENT"], "run_start": marks["PIPELINE_START"],
            "whole_run": ru.ru_utime + ru.ru_stime}  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--postgres", action="store_true", help="the instance's storage on the local Postgres")
    args = ap.parse_args(argv)
    home = Path(tempfile.mkdtemp(prefix="bench_launch_cpu_"))
    os.environ["DAGSTER_HOME"] = str(home)
    os.environ.setdefault("NOETL_DAGSTER_HOME", str(home / "noetl"))
    coordinator = {"module": "noetl_dagster.sensors.coordinator", "class": "NoetlRunCoordinator",
                   "config": {"max_concurrent_runs": -1}}  # fmt: skip
    launcher = {"module": "dagster._core.test_utils", "class": "MockedRunLauncher"}
    import yaml

    settings: dict[str, Any] = {"telemetry": {"enabled": False}, "run_coordinator": coordinator,
                                "run_launcher": launcher}  # fmt: skip
    pg_db = f"bench_launch_cpu_{os.getpid()}" if args.postgres else None
    if pg_db:
        import psycopg

        with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{pg_db}"')
        settings["storage"] = {
            "postgres": {"postgres_url": f"postgresql+psycopg2://postgres@127.0.0.1:5432/{pg_db}"}
        }
    (home / "dagster.yaml").write_text(yaml.safe_dump(settings))
    try:
        _measure(args, home)
    finally:
        if pg_db:
            import psycopg

            with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
                conn.execute(f'DROP DATABASE IF EXISTS "{pg_db}" WITH (FORCE)')


def _measure(args: argparse.Namespace, home: Path) -> None:
    sys.path.insert(0, str(REPO))
    import dagster as dg
    from dagster._core.code_pointer import CodePointer
    from dagster._core.origin import JobPythonOrigin, RepositoryPythonOrigin
    from dagster._core.remote_origin import (
        RegisteredCodeLocationOrigin,
        RemoteJobOrigin,
        RemoteRepositoryOrigin,
    )
    from dagster._core.run_coordinator import SubmitRunContext
    from dagster._grpc.types import ExecuteRunArgs
    from dagster._serdes import serialize_value

    from noetl_dagster.sensors import zygote
    from noetl_dagster.sensors.launcher import _storage_modules

    kind = "Postgres" if args.postgres else "SQLite"
    print(
        f"load average {os.getloadavg()[0]:.1f}; {args.rounds} rounds; {kind} instance, DAGSTER_HOME {home}"
    )
    origin = RepositoryPythonOrigin(
        sys.executable, CodePointer.from_module("example_project.definitions", "defs", None)
    )
    instance = dg.DagsterInstance.get()
    ref = instance.get_ref()
    repo = zygote.load(json.dumps({"origin": serialize_value(origin), "load_data": None,
                                   "instance_ref": serialize_value(ref)}))  # fmt: skip
    instance = dg.DagsterInstance.from_ref(ref)  # the zygote's instance: its forks get a copy
    job = repo.get_job("hello_dagster")
    job_origin = JobPythonOrigin("hello_dagster", origin)
    remote = RemoteJobOrigin(RemoteRepositoryOrigin(RegisteredCodeLocationOrigin("example"), "__repository__"),
                             "hello_dagster")  # fmt: skip
    zygote.cache_schema_checks(instance)
    storage = instance.run_storage
    wrapped = {k: storage.__dict__[k] for k in zygote.SCHEMA_CHECKS if k in storage.__dict__}

    def new_run() -> Any:
        return instance.create_run_for_job(job_def=job, job_code_origin=job_origin, remote_job_origin=remote)

    variants = {"checks remembered": (True, False), "checks asked (Dagster)": (False, False),
                "checks remembered, gc.freeze": (True, True)}  # fmt: skip
    daemon: dict[str, list[float]] = {k: [] for k in variants}
    ours: dict[str, list[float]] = {
        "plan snapshot read (once per snapshot now)": [],
        "request + args": [],
        "run tags": [],
    }
    worker: dict[str, dict[str, list[float]]] = {k: {"first_event": [], "run_start": [], "whole_run": []}
                                                 for k in variants}  # fmt: skip
    for _ in range(args.rounds):
        for label, (cached, freeze) in variants.items():
            _toggle(storage, wrapped, cached)
            run = new_run()
            c = time.process_time()
            instance.run_coordinator.submit_run(SubmitRunContext(run, workspace=None))
            daemon[label].append(time.process_time() - c)
            if not freeze:
                c = time.process_time()
                plan = instance.get_execution_plan_snapshot(run.execution_plan_snapshot_id)
                load_data = serialize_value(plan.repository_load_data) if plan.repository_load_data else None
                ours["plan snapshot read (once per snapshot now)"].append(time.process_time() - c)
                c = time.process_time()
                json.dumps({"origin": serialize_value(origin), "load_data": load_data,
                            "modules": _storage_modules(ref), "instance_ref": serialize_value(ref)})  # fmt: skip
                worker_args = serialize_value(
                    ExecuteRunArgs(job_origin=job_origin, run_id=run.run_id, instance_ref=ref)
                )
                ours["request + args"].append(time.process_time() - c)
            else:
                worker_args = serialize_value(
                    ExecuteRunArgs(job_origin=job_origin, run_id=run.run_id, instance_ref=ref)
                )
            marks = _fork_worker(worker_args, freeze, type(instance.event_log_storage))
            if not freeze:
                c = time.process_time()
                instance.add_run_tags(run.run_id, {"noetl/run_worker_pid": "1", "noetl/warm_launch": "true"})
                ours["run tags"].append(time.process_time() - c)
            for k, v in marks.items():
                worker[label][k].append(v)
            status = instance.get_run_by_id(run.run_id).status
            assert status == dg.DagsterRunStatus.SUCCESS, status
    _toggle(storage, wrapped, True)

    def ms(xs: list[float]) -> str:
        return f"{statistics.median(xs) * 1000:7.1f}"

    print("CPU ms, medians of rounds          daemon: submit_run  worker: first event  RUN_START  whole run")
    for label in variants:
        w = worker[label]
        print(f"  {label:32} {ms(daemon[label])}            {ms(w['first_event'])}       "
              f"{ms(w['run_start'])}  {ms(w['whole_run'])}")  # fmt: skip
    print("the warm launcher's own work per launch (CPU ms, medians):",
          ", ".join(f"{k} {ms(v).strip()}" for k, v in ours.items()))  # fmt: skip
    print(f"load average {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
