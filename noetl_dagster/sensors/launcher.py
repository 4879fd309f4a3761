"""A run launcher that forks run workers from a warm process (issue 19 §3: request to start).

Dagster's ``DefaultRunLauncher`` asks the code server to start each run; the code server spawns a
new interpreter (``multiprocessing`` "spawn") that imports Dagster and loads the code location
again before the run starts: ~4 s of CPU per run with the example project, 40-75 s of wall time
on the shared 2-core machine at load 12-20 (docs/capacity.md). ``NoetlRunLauncher`` keeps one
warm process per code location (:mod:`noetl_dagster.sensors.zygote`) that has done both once and
forks a run worker per run; the worker runs ``dagster api execute_run``'s code on the warm
definitions, so the run's events, logs, retries, termination and run monitoring are Dagster's.

It is for a daemon that runs where the code is (``dagster dev``, one host, the code location's
Python reachable from the daemon). Anything else falls back to the code server, as before:
a code location the daemon cannot load, a dead warm process, ``warm: false``.

    run_launcher:
      module: noetl_dagster.sensors.launcher
      class: NoetlRunLauncher
      config: {warm: true}

A new zygote is started when the code server changes (its server id: a reload), so a run never
executes older code than the code location shows. Terminating a forked run sends SIGINT to its
worker, which Dagster turns into a clean interruption (the run ends CANCELED).
"""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Mapping
from typing import Any

from dagster import BoolSource, Field
from dagster._core.launcher import LaunchRunContext
from dagster._core.launcher.default_run_launcher import DefaultRunLauncher
from dagster._serdes import ConfigurableClassData

from noetl_dagster.util.procs import pid_alive

log = logging.getLogger("noetl_dagster.launcher")

TAG_PID = "noetl/run_worker_pid"
TAG_HOST = "noetl/run_worker_host"
TAG_WARM = "noetl/warm_launch"
READY_TIMEOUT_S = 600.0  # loading a large code location on a busy machine
LOAD_DATA_CACHE = 256  # execution plan snapshots whose load data a launcher keeps


class Zygote:
    """One warm process: started, loaded, then asked to fork one run worker per line."""

    def __init__(self, executable: str, request: str, key: Any):
        self.key = key
        self.proc = subprocess.Popen(
            [executable, "-m", "noetl_dagster.sensors.zygote"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=None, text=True, bufsize=1,
        )  # fmt: skip
        self.lock = threading.Lock()
        self.ready_line = self._ask(request, READY_TIMEOUT_S)
        if not self.ready_line.startswith("ready "):
            self.close()
            raise RuntimeError(f"warm run worker did not load the code location: {self.ready_line}")

    def _ask(self, line: str, timeout: float) -> str:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(line.replace("\n", " ") + "\n")
        self.proc.stdin.flush()
        answer: list[str] = []
        reader = threading.Thread(target=lambda: answer.append(self.proc.stdout.readline()), daemon=True)  # type: ignore[union-attr]
        reader.start()
        reader.join(timeout)
        if not answer or not answer[0]:
            self.close()
            raise RuntimeError("warm run worker did not answer" + ("" if answer else f" in {timeout:.0f} s"))
        return answer[0].strip()

    def fork_run(self, serialized_args: str) -> int:
        with self.lock:
            if self.proc.poll() is not None:
                raise RuntimeError(f"warm run worker exited ({self.proc.returncode})")
            answer = self._ask(serialized_args, 60.0)
        if not answer.startswith("ok "):
            raise RuntimeError(f"warm run worker could not fork: {answer}")
        return int(answer.split()[1])

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def close(self) -> None:
        try:
            if self.proc.stdin:
                self.proc.stdin.close()  # end of input: the zygote exits; its forked runs go on
        except OSError:
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()


class NoetlRunLauncher(DefaultRunLauncher):
    def __init__(self, inst_data: ConfigurableClassData | None = None, warm: bool = True):
        super().__init__(inst_data=inst_data)
        self.warm = warm
        self._zygotes: dict[Any, Zygote] = {}
        self._lock = threading.Lock()
        self._load_data_by_snapshot: dict[str, str | None] = {}

    @classmethod
    def config_type(cls) -> dict[str, Any]:
        return {
            "warm": Field(BoolSource, is_required=False, default_value=True,
                          description="fork run workers from a warm process (false: the code server starts them)"),
        }  # fmt: skip

    @classmethod
    def from_config_value(
        cls, inst_data: ConfigurableClassData, config_value: Mapping[str, Any]
    ) -> NoetlRunLauncher:
        return cls(inst_data=inst_data, warm=config_value.get("warm", True))

    # -- launching -------------------------------------------------------------------------
    def launch_run(self, context: LaunchRunContext) -> None:
        run = context.dagster_run
        origin = run.job_code_origin
        if not self.warm or origin is None or context.workspace is None:
            return super().launch_run(context)
        try:
            pid = self._fork(context, origin)
        except Exception as e:  # noqa: BLE001 - the code server path always works
            log.warning(
                "noetl: warm launch of run %s failed (%s); launching through the code server", run.run_id, e
            )
            return super().launch_run(context)
        self._instance.add_run_tags(
            run.run_id, {TAG_PID: str(pid), TAG_HOST: socket.gethostname(), TAG_WARM: "true"}
        )
        self._run_ids.add(run.run_id)
        return None

    def _fork(self, context: LaunchRunContext, origin: Any) -> int:
        from dagster._grpc.types import ExecuteRunArgs  # noqa: PLC0415
        from dagster._serdes import serialize_value  # noqa: PLC0415

        run = context.dagster_run
        location_name = run.remote_job_origin.repository_origin.code_location_origin.location_name  # type: ignore[union-attr]
        location = context.workspace.get_code_location(location_name)  # type: ignore[union-attr]
        server_id = getattr(location, "server_id", None)  # a reloaded code server has a new id
        repo_origin = origin.repository_origin
        load_data = None  # what the code server recorded: the run worker reconstructs the repository with it
        if run.has_repository_load_data and run.execution_plan_snapshot_id:
            load_data = self._load_data(run.execution_plan_snapshot_id)
        ref = self._instance.get_ref()
        request = json.dumps({"origin": serialize_value(repo_origin), "load_data": load_data,
                              "modules": _storage_modules(ref), "instance_ref": serialize_value(ref)})  # fmt: skip
        key = (location_name, server_id, request)
        zygote = self._zygote(key, repo_origin.executable_path or sys.executable, request)
        args = ExecuteRunArgs(job_origin=origin, run_id=run.run_id, instance_ref=ref)
        try:
            return zygote.fork_run(serialize_value(args))
        except Exception:
            with self._lock:
                if self._zygotes.get(key) is zygote:
                    self._zygotes.pop(key)
            zygote.close()
            raise

    def _load_data(self, snapshot_id: str) -> str | None:
        """The repository load data of an execution plan snapshot, serialized; read once per snapshot
        (its id is a hash of its content, so what is stored under it never changes; issue 35: a
        database read and the plan's deserialization per launch, ~2-3 ms of the daemon's CPU)."""
        with self._lock:
            if snapshot_id in self._load_data_by_snapshot:
                return self._load_data_by_snapshot[snapshot_id]
        from dagster._serdes import serialize_value  # noqa: PLC0415

        plan = self._instance.get_execution_plan_snapshot(snapshot_id)
        load_data = serialize_value(plan.repository_load_data) if plan.repository_load_data else None
        with self._lock:
            if len(self._load_data_by_snapshot) >= LOAD_DATA_CACHE:
                self._load_data_by_snapshot.pop(next(iter(self._load_data_by_snapshot)))  # the oldest
            self._load_data_by_snapshot[snapshot_id] = load_data
        return load_data

    def _zygote(self, key: Any, executable: str, request: str) -> Zygote:
        with self._lock:
            z = self._zygotes.get(key)
            if z is not None and z.alive:
                return z
            for old_key in [k for k in self._zygotes if k[0] == key[0]]:  # the location's older code
                self._zygotes.pop(old_key).close()
            z = Zygote(executable, request, key)
            self._zygotes[key] = z
            return z

    # -- run monitoring: a forked worker that died (kill -9, OOM) fails its run, as the code server does
    @property
    def supports_check_run_worker_health(self) -> bool:
        return True

    def check_run_worker_health(self, run: Any) -> Any:
        from dagster._core.launcher import CheckRunHealthResult, WorkerStatus  # noqa: PLC0415

        pid = run.tags.get(TAG_PID)
        if pid is None or run.tags.get(TAG_HOST) != socket.gethostname():
            return CheckRunHealthResult(
                WorkerStatus.RUNNING, "launched through the code server, which watches it"
            )
        if pid_alive(int(pid)):
            return CheckRunHealthResult(WorkerStatus.RUNNING)
        return CheckRunHealthResult(WorkerStatus.FAILED, f"run worker process {pid} is gone")

    # -- termination -----------------------------------------------------------------------
    def terminate(self, run_id: str) -> bool:
        run = self._instance.get_run_by_id(run_id) if self.has_instance else None
        if run is None or run.is_finished or TAG_PID not in run.tags:
            return super().terminate(run_id)
        if run.tags.get(TAG_HOST) != socket.gethostname():
            self._instance.report_engine_event(
                f"run worker {run.tags[TAG_PID]} runs on {run.tags.get(TAG_HOST)}, not here: cannot terminate it",
                run, cls=self.__class__,
            )  # fmt: skip
            return False
        self._instance.report_run_canceling(run)
        try:
            os.kill(int(run.tags[TAG_PID]), signal.SIGINT)  # Dagster's own interruption of the run worker
        except ProcessLookupError:
            return False
        return True

    def dispose(self) -> None:
        with self._lock:
            zygotes, self._zygotes = list(self._zygotes.values()), {}
        for z in zygotes:
            z.close()
        super().dispose()


def _storage_modules(ref: Any) -> list[str]:
    """The modules of the instance's storages, which every run worker imports to open the instance."""
    out = []
    for value in ref._asdict().values():  # InstanceRef is a NamedTuple of ConfigurableClassData
        module = getattr(value, "module_name", None)
        if isinstance(module, str):
            out.append(module)
    return sorted(set(out))
