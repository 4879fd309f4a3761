"""A warm process that forks Dagster run workers (``python -m noetl_dagster.sensors.zygote``).

Started by :class:`noetl_dagster.sensors.launcher.NoetlRunLauncher`, once per code location.
It imports Dagster and loads the code location once, then reads one line per run from stdin (a
serialized ``ExecuteRunArgs``) and forks: the child is what ``dagster api execute_run`` would be,
without the interpreter start, the imports and the code location load (seconds of CPU each
time, docs/capacity.md). It answers one line per request on stdout: ``ok <pid>`` or ``error
<message>``.

Protocol, first line: what to load (see :func:`load`); answer ``ready <pid>`` or
``error <message>``. End of stdin ends the zygote; the runs it forked keep running (they are
ordinary run workers, reaped by ``SIGCHLD`` being ignored here, and restored in the child).

The child runs the job from the repository loaded here (the same code pointer; a run needs the
code as it was when the code location was loaded, and the launcher starts a new zygote when the
code server is replaced, e.g. on a reload).
"""

from __future__ import annotations

import importlib
import os
import signal
import sys
import threading
import traceback
from typing import Any

# imported by every run worker after the code location: the CLI body, the executor, the SQL storages
WARM_MODULES = (
    "dagster._cli.api", "dagster._core.execution.api", "dagster._core.executor.in_process",
    "dagster._core.execution.plan.execute_step", "dagster._core.storage.sql", "alembic.script", "alembic.runtime.migration",
)  # fmt: skip
PROFILE_ENV = "NOETL_ZYGOTE_PROFILE"  # a directory: each forked run worker writes its CPU profile there


def cache_dagster_migrations() -> None:
    """Read Dagster's alembic migration scripts once per process, not once per check.

    A SQLite Dagster instance keeps each run's event log in a file of its own; opening one (the
    daemon writing a run's first event, the run worker writing RUN_START) checks and stamps its
    schema revision, and alembic builds each check's ``ScriptDirectory`` by executing every
    migration script again (~180 files: 0.1-0.3 s of CPU each time, twice per run on the way to
    the run's start; issue 35). The scripts are part of the installed Dagster, which a process
    never changes under itself, so one ``ScriptDirectory`` per script location is kept (with its
    revision map built) for Dagster's own locations only; any other alembic user is untouched.
    """
    import dagster  # noqa: PLC0415
    from alembic.script.base import ScriptDirectory  # noqa: PLC0415

    if getattr(ScriptDirectory.from_config, "noetl_cached", False):
        return
    original = ScriptDirectory.from_config
    root = os.path.dirname(os.path.abspath(dagster.__file__)) + os.sep
    cache: dict[str, Any] = {}
    lock = threading.Lock()

    def from_config(config: Any) -> Any:
        location = config.get_main_option("script_location") or ""  # "dagster:_core/storage/alembic"
        if not (location.startswith("dagster:") or os.path.abspath(location).startswith(root)):
            return original(config)
        with lock:
            script = cache.get(location)
            if script is None:
                script = original(config)
                script.get_heads()  # the revision map, built once here (read-only afterwards)
                cache[location] = script
        return script

    from_config.noetl_cached = True  # type: ignore[attr-defined]
    from_config.noetl_original = original  # type: ignore[attr-defined]
    ScriptDirectory.from_config = staticmethod(from_config)  # type: ignore[method-assign,assignment]


# SqlRunStorage's schema checks: each reflects the table's columns over a connection of its own, and
# Dagster asks one on every run record read and every run status event (issue 35)
SCHEMA_CHECKS = ("has_run_stats_index_cols", "has_bulk_actions_selector_cols", "has_backfill_id_column",
                 "has_bulk_action_job_name_column", "has_backfill_tags_table")  # fmt: skip


def cache_schema_checks(instance: Any) -> None:
    """Remember the run storage's positive schema checks for this instance (and its forks).

    ``SqlRunStorage.has_run_stats_index_cols`` and its siblings inspect the database's catalog
    every time they are asked: twice on a run worker's way to RUN_START, three times in the daemon's
    launch of a run. A column or table they find stays (Dagster's migrations add them; none removes
    one under a running process), so a True answer is kept; a False one is asked again next time,
    so a migration made while this process runs is still seen."""
    storage = getattr(instance, "run_storage", None)
    if storage is None or getattr(storage, "noetl_checks_cached", False):
        return
    for name in SCHEMA_CHECKS:
        original = getattr(storage, name, None)
        if original is None:
            continue

        def check(original: Any = original, known: list[bool] = []) -> bool:  # noqa: B006 - the memo
            if known:
                return True
            found = bool(original())
            if found:
                known.append(True)
            return found

        setattr(storage, name, check)  # this storage object only
    storage.noetl_checks_cached = True


def _reply(line: str) -> None:
    sys.stdout.write(line.replace("\n", " ") + "\n")
    sys.stdout.flush()


def load(request: str) -> Any:
    """Load the code location and make the run worker's reconstruction of it free in the children.

    ``request``: JSON ``{"origin": <serialized RepositoryPythonOrigin>, "load_data": <serialized
    RepositoryLoadData or null>}``; the load data is what the code server recorded with the runs
    (a run worker reconstructs the repository with it), so the children find exactly this one.
    """
    import json  # noqa: PLC0415

    import dagster._core.definitions.reconstruct as reconstruct  # noqa: PLC0415
    from dagster._core.origin import RepositoryPythonOrigin  # noqa: PLC0415
    from dagster._serdes import deserialize_value  # noqa: PLC0415
    from dagster._utils.hosted_user_process import recon_repository_from_origin  # noqa: PLC0415

    req = json.loads(request)
    cache_dagster_migrations()  # before the instance is opened below and in every forked run worker
    origin = deserialize_value(req["origin"], RepositoryPythonOrigin)
    load_data = deserialize_value(req["load_data"]) if req.get("load_data") else None
    recon_repo = recon_repository_from_origin(origin)
    if load_data is not None:
        recon_repo = recon_repo.with_repository_load_data(load_data)
    repo_def = recon_repo.get_definition()
    original = reconstruct.reconstruct_repository_def_from_pointer

    def warm(pointer: Any, repository_load_data: Any = None) -> Any:
        if pointer == recon_repo.pointer and repository_load_data == load_data:
            return repo_def
        return original(pointer, repository_load_data)

    reconstruct.reconstruct_repository_def_from_pointer = warm  # this process and its children only
    for module in WARM_MODULES + tuple(req.get("modules") or ()):  # what every run worker imports next
        try:
            importlib.import_module(module)
        except Exception:  # noqa: BLE001 - only a head start; the run worker imports it itself
            pass
    if req.get("instance_ref"):
        _open_instance_once(deserialize_value(req["instance_ref"]))
    return repo_def


def _open_instance_once(ref: Any) -> None:
    """Open the instance here, once: a run worker's ``DagsterInstance.from_ref(ref)`` gets a copy.

    Opening it checks each storage's schema revision (alembic parses every migration script: ~1 s
    of CPU per run worker with the SQLite storages). Dagster's SQL storages hold no connection
    between calls (NullPool) and start no thread when opened, so a forked child may use the copy;
    if this process has any other thread afterwards, the children open their own as before.
    """
    from dagster import DagsterInstance  # noqa: PLC0415

    before = threading.active_count()
    instance = DagsterInstance.from_ref(ref)
    cache_schema_checks(instance)
    instance.run_storage.has_run_stats_index_cols()  # asked here once, so no fork asks it again
    if threading.active_count() != before:
        return
    original = DagsterInstance.from_ref

    def from_ref(instance_ref: Any) -> Any:
        return instance if instance_ref == ref else original(instance_ref)

    DagsterInstance.from_ref = staticmethod(from_ref)  # type: ignore[method-assign] - this process and its children


def run_child(serialized_args: str) -> int:
    """In the forked child: ``dagster api execute_run`` on the warm code; the exit code."""
    from dagster._cli.api import execute_run_command  # noqa: PLC0415
    from dagster._utils.interrupts import setup_interrupt_handlers  # noqa: PLC0415

    signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # subprocess.wait in the run needs its children
    signal.signal(signal.SIGINT, signal.default_int_handler)
    setup_interrupt_handlers()  # SIGTERM -> SIGINT: the run is interrupted and reported, as in the CLI
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)  # the zygote's request pipe is not the run's
    os.dup2(2, 1)  # run worker output goes where the daemon's does
    profile_dir = os.environ.get(PROFILE_ENV)
    profiler = None
    if profile_dir:  # CPU profile of each run worker (benchmarks/bench_dagster_latency.py --profile)
        import cProfile  # noqa: PLC0415
        import time  # noqa: PLC0415

        profiler = cProfile.Profile(time.process_time)
        profiler.enable()
    try:
        execute_run_command.callback(serialized_args, None)
        return 0
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else 1
    except BaseException:  # noqa: BLE001 - the run worker's own errors are in the event log; this is the rest
        traceback.print_exc()
        return 1
    finally:
        if profiler is not None:
            profiler.disable()
            profiler.dump_stats(os.path.join(profile_dir, f"run_worker_{os.getpid()}.prof"))


def serve(stdin: Any = None) -> None:
    stdin = stdin or sys.stdin
    first = stdin.readline()
    try:
        load(first.strip())
    except BaseException as e:  # noqa: BLE001 - the launcher falls back to the code server
        _reply(f"error {type(e).__name__}: {e}")
        return
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # finished run workers are reaped by the kernel
    _reply(f"ready {os.getpid()} threads={threading.active_count()}")
    for line in stdin:
        args = line.strip()
        if not args:
            continue
        try:
            pid = os.fork()
        except OSError as e:
            _reply(f"error fork failed: {e}")
            continue
        if pid == 0:
            code = 1
            try:
                code = run_child(args)
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
        _reply(f"ok {pid}")


if __name__ == "__main__":
    try:
        serve()
    except KeyboardInterrupt:  # dagster dev stopped with Ctrl-C: the process group's SIGINT
        pass
