"""Request-to-start latency through Dagster (issue 19 §3): where a detached request's seconds go.

Starts the real ``dagster dev`` (webserver + daemon) on the example code location with
``example_project/dagster.yaml`` (QueuedRunCoordinator, the router sensor), records detached
requests of ``hello_dagster.yaml`` one after the other (``noetl-dagster run --runner dagster
--detach`` does the same) and splits each request's way to its run's start with the run's own
event log: request -> run enqueued (router sensor tick and evaluation) -> starting (run queue
and launcher) -> started (the run worker process booted and loaded the code).
Target: p50 request-to-start <= 1.0 s (issue 35; issue 19 asked 3 s). The first request is a warm-up (code location load).

Two configurations in the same run (the machine is shared: compare them, not absolute times):
``before`` is Dagster's default run launcher (the code server spawns a new interpreter per run)
with the playbook cache off; ``after`` is ``example_project/dagster.yaml`` as shipped
(``NoetlRunLauncher`` forks run workers from a warm process; parsed playbooks cached).
``--postgres`` puts the Dagster instance (runs, event logs, schedules) on the local Postgres.
The boot is also measured in CPU seconds, outside Dagster's event log: a cold run worker
(a new interpreter: import Dagster, load the code location, open the instance) against a warm
one (forked from a process that loaded the code location: open the instance, find the job).

Run: ``python -m benchmarks.bench_dagster_latency [--requests N] [--config before|after|both] [--postgres] [--burst N]``
or ``python -m benchmarks --only dagster_latency``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
HELLO = REPO / "example_project" / "playbooks" / "hello_dagster.yaml"
TARGET_S = 1.0
STAGES = ("RUN_STARTING", "RUN_START", "STEP_START")  # a run launched at once has no RUN_ENQUEUED


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_run(instance, eid: str, timeout: float):
    import dagster as dg

    deadline = time.time() + timeout
    while time.time() < deadline:
        runs = instance.get_runs(dg.RunsFilter(tags={"noetl/execution_id": eid}))
        if runs and runs[0].status in (dg.DagsterRunStatus.SUCCESS, dg.DagsterRunStatus.FAILURE):
            return runs[0]
        time.sleep(0.2)
    raise RuntimeError(f"no finished run for execution {eid} in {timeout:.0f} s")


def _stages(instance, run) -> dict[str, float]:
    out: dict[str, float] = {}
    for rec in instance.all_logs(run.run_id):
        t = rec.dagster_event.event_type.name if rec.dagster_event else None  # the value is PIPELINE_*
        if t == "ENGINE_EVENT" and rec.message.startswith("Started process for run") and "PROCESS" not in out:
            out["PROCESS"] = rec.timestamp  # the run worker's first event (dagster api execute_run's own)
        if t in (*STAGES, "RUN_ENQUEUED") and t not in out:
            out[t] = rec.timestamp
    return out


def _tick_of(instance, run_id: str) -> tuple[float, float] | None:
    """(start, end) of the router sensor tick that requested ``run_id``."""
    from dagster._core.scheduler.instigation import InstigatorType

    for state in instance.all_instigator_state(instigator_type=InstigatorType.SENSOR):
        if state.name != "noetl_router":
            continue
        for tick in instance.get_ticks(state.instigator_origin_id, state.selector_id, limit=50):
            if run_id in tick.run_ids:
                return tick.timestamp, tick.end_timestamp or tick.timestamp
    return None


PG_ADMIN = "postgresql://postgres@127.0.0.1:5432/postgres"


def _instance_yaml(config: str, pg_url: str | None, tree: Path = REPO) -> str:
    import yaml

    settings = yaml.safe_load((tree / "example_project" / "dagster.yaml").read_text())
    if config == "before" and tree == REPO:
        settings.pop("run_launcher", None)  # Dagster's DefaultRunLauncher: the code server spawns each run
    if pg_url:
        settings["storage"] = {"postgres": {"postgres_url": pg_url}}
    return yaml.safe_dump(settings, sort_keys=False)


def _pg_database(name: str, drop: bool = False) -> str:
    import psycopg

    with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        if not drop:
            conn.execute(f'CREATE DATABASE "{name}"')
    return f"postgresql+psycopg2://postgres@127.0.0.1:5432/{name}"


class _Session:
    """One ``dagster dev`` (webserver + daemon) on its own DAGSTER_HOME and NoETL data directory."""

    def __init__(self, config: str, postgres: bool, tree: Path | None):
        self.tmp = Path(tempfile.mkdtemp(prefix="bench_dagster_latency_"))
        home, self.noetl_home = self.tmp / "dagster_home", self.tmp / "noetl"
        home.mkdir()
        self.pg_name = f"bench_dagster_{os.getpid()}_{config}" if postgres else None
        pg_url = _pg_database(self.pg_name) if self.pg_name else None
        (home / "dagster.yaml").write_text(_instance_yaml(config, pg_url, tree or REPO))
        cache = config == "after" or tree is not None
        env = {**os.environ, "DAGSTER_HOME": str(home), "NOETL_DAGSTER_HOME": str(self.noetl_home),
               "NOETL_DAGSTER_PLAYBOOK_CACHE": str(self.tmp / "playbook_cache") if cache else "off"}  # fmt: skip
        # the code location is example_project in the measured tree: dagster dev runs in a temporary
        # directory, so the tree goes on PYTHONPATH (without it the location fails to import)
        env["PYTHONPATH"] = os.pathsep.join(
            [str(tree or REPO), *[p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]]
        )
        port = _free_port()
        self.log = open(self.tmp / "dagster_dev.log", "wb")  # noqa: SIM115 - closed in close()
        self.proc = subprocess.Popen(
            [str(Path(sys.executable).parent / "dagster"), "dev", "-m", "example_project.definitions", "-h", "127.0.0.1", "-p", str(port)],
            cwd=self.tmp, env=env, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
        self.port, self.home, self.instance = port, home, None

    def ready(self) -> None:
        import dagster as dg
        import httpx

        deadline = time.time() + 240
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError((self.tmp / "dagster_dev.log").read_text()[-2000:])
            try:
                if httpx.get(f"http://127.0.0.1:{self.port}/server_info", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.time() > deadline:
                raise RuntimeError("dagster dev did not answer in 240 s")
            time.sleep(0.5)
        self.instance = dg.DagsterInstance.from_config(str(self.home))

    def request(self, i: int, timeout: float) -> dict[str, float] | None:
        from noetl_dagster.translator.runner import run_playbook_dagster

        instance = self.instance
        t0 = time.time()
        req = run_playbook_dagster(HELLO, {"name": f"r{i}"}, data_dir=self.noetl_home, tenant="demo", project="examples",
                                   detach=True)  # fmt: skip
        run = _wait_run(instance, req.execution_id, timeout)
        st = _stages(instance, run)
        if not all(s in st for s in STAGES):
            return None
        created = instance.get_run_record_by_id(run.run_id).create_timestamp.timestamp()
        tick = _tick_of(instance, run.run_id) or (t0, t0)
        return {"tick_wait": max(0.0, tick[0] - t0), "tick_to_created": created - max(t0, tick[0]),
                "process": st.get("PROCESS", st["RUN_START"]) - st["RUN_STARTING"],
                "process_to_start": st["RUN_START"] - st.get("PROCESS", st["RUN_START"]),
                "created": created - t0, "queued": st["RUN_STARTING"] - created,
                "boot": st["RUN_START"] - st["RUN_STARTING"], "total": st["RUN_START"] - t0,
                "first_op": st["STEP_START"] - st["RUN_START"],
                "at_once": float("RUN_ENQUEUED" not in st),
                "warm": float(run.tags.get("noetl/warm_launch") == "true")}  # fmt: skip

    def close(self) -> None:
        if self.instance is not None:
            self.instance.dispose()
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGINT)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)
        self.log.close()
        shutil.rmtree(self.tmp, ignore_errors=True)
        if self.pg_name:
            _pg_database(self.pg_name, drop=True)


def measure_side_by_side(
    requests: int, timeout: float, configs: tuple[str, ...], postgres: bool = False, trees: dict | None = None
) -> dict[str, list[dict[str, float]]]:
    """Both configurations' ``dagster dev`` up at once, requests alternating between them: the
    shared machine's load falls on both alike (issue 35: one session after the other saw load 3 and
    then 10). Run the same number of each, one at a time."""
    trees = trees or {}
    sessions = {}
    try:
        for c in configs:
            sessions[c] = _Session(c, postgres, trees.get(c))
        for c in configs:
            sessions[c].ready()
            sessions[c].request(0, timeout)  # warm-up: the daemon's first tick loads the code location
        rows: dict[str, list[dict[str, float]]] = {c: [] for c in configs}
        for i in range(1, requests + 1):
            for c in configs if i % 2 else reversed(configs):
                row = sessions[c].request(i, timeout)
                if row is not None:
                    rows[c].append(row)
        return rows
    finally:
        for sess in sessions.values():
            sess.close()
        from noetl_dagster.resources.noetl import close_all_services

        close_all_services()


def measure(
    requests: int,
    timeout: float,
    config: str = "after",
    postgres: bool = False,
    burst: int = 0,
    tree: Path | None = None,
) -> tuple[list[dict[str, float]], dict[str, float] | None]:
    """(one row per sequential request, the burst's figures or None). ``tree``: another checkout
    (e.g. main's commit in a temporary worktree) whose code and dagster.yaml ``dagster dev`` runs."""
    sess = _Session(config, postgres, tree)
    try:
        sess.ready()
        rows = [r for i in range(requests + 1) if (r := sess.request(i, timeout)) is not None and i > 0]
        burst_figures = _burst(sess.instance, burst, sess.noetl_home, timeout) if burst else None
        return rows, burst_figures
    finally:
        sess.close()
        from noetl_dagster.resources.noetl import close_all_services

        close_all_services()


def _burst(instance, n: int, noetl_home: Path, timeout: float) -> dict[str, float]:
    """``n`` detached requests at once; runs per minute from the first request to the last run's end."""
    from noetl_dagster.translator.runner import run_playbook_dagster

    t0 = time.time()
    sent = []
    for i in range(n):
        req = run_playbook_dagster(HELLO, {"name": f"b{i}"}, data_dir=noetl_home, tenant="demo", project="examples",
                                   detach=True)  # fmt: skip
        sent.append((time.time(), req.execution_id))
    starts, ends, failed = [], [], 0
    for t_req, eid in sent:
        run = _wait_run(instance, eid, timeout)
        failed += run.status.value != "SUCCESS"
        stats = instance.get_run_stats(run.run_id)
        starts.append((_stages(instance, run).get("RUN_START") or stats.start_time or t_req) - t_req)
        ends.append((stats.end_time or time.time()) - t_req)
    span = max(t_req + e for (t_req, _), e in zip(sent, ends, strict=True)) - t0
    return {"burst": n, "failed": failed, "span": span, "per_min": n / span * 60,
            "start_p50": statistics.median(starts), "start_max": max(starts),
            "done_p50": statistics.median(ends), "done_p99": statistics.quantiles(ends, n=100)[98] if n > 1 else ends[0]}  # fmt: skip


COLD_BOOT = """
import sys, dagster as dg
from dagster._core.code_pointer import CodePointer
from dagster._utils.hosted_user_process import recon_repository_from_origin
from dagster._core.origin import RepositoryPythonOrigin
origin = RepositoryPythonOrigin(sys.executable, CodePointer.from_module("example_project.definitions", "defs", None))
recon_repository_from_origin(origin).get_reconstructable_job("hello_dagster").get_definition()
dg.DagsterInstance.ephemeral().dispose()
"""


def boot_cpu(samples: int = 3) -> dict[str, float]:
    """CPU seconds (user + system) of a run worker's boot: a new interpreter vs a fork of a warm one."""
    import resource
    import tempfile as tf

    from noetl_dagster.sensors import zygote

    def cpu(ru: resource.struct_rusage) -> float:
        return ru.ru_utime + ru.ru_stime

    with tf.TemporaryDirectory() as cache:
        env = {**os.environ, "NOETL_DAGSTER_PLAYBOOK_CACHE": "off"}
        cold, cached = [], []
        for i in range(samples):
            for out, e in ((cold, env), (cached, {**env, "NOETL_DAGSTER_PLAYBOOK_CACHE": cache})):
                before = cpu(resource.getrusage(resource.RUSAGE_CHILDREN))
                subprocess.run(
                    [sys.executable, "-c", COLD_BOOT], cwd=REPO, env=e, check=True, capture_output=True
                )
                if not (out is cached and i == 0):  # the first cached boot fills the cache
                    out.append(cpu(resource.getrusage(resource.RUSAGE_CHILDREN)) - before)
    import json

    from dagster._core.code_pointer import CodePointer
    from dagster._core.origin import RepositoryPythonOrigin
    from dagster._serdes import serialize_value
    from dagster._utils.hosted_user_process import recon_repository_from_origin

    origin = RepositoryPythonOrigin(
        sys.executable, CodePointer.from_module("example_project.definitions", "defs", None)
    )
    zygote.load(json.dumps({"origin": serialize_value(origin), "load_data": None}))
    import dagster as dg

    warm = []
    for _ in range(samples):
        pid = os.fork()
        if pid == 0:
            code = 0
            try:
                recon_repository_from_origin(origin).get_reconstructable_job("hello_dagster").get_definition()
                dg.DagsterInstance.ephemeral().dispose()
            except BaseException:  # noqa: BLE001
                code = 1
            os._exit(code)
        _, status, ru = os.wait4(pid, 0)
        if status == 0:
            warm.append(cpu(ru))
    return {
        "cold": statistics.median(cold),
        "cold_cached": statistics.median(cached),
        "warm": statistics.median(warm),
    }


def _report(config: str, rows: list[dict[str, float]], b: dict[str, float] | None, postgres: bool) -> None:
    if b is not None:
        print(f"{config}: burst of {b['burst']:.0f} detached requests ({'Postgres' if postgres else 'SQLite'} instance): "
              f"{b['per_min']:.1f} runs per minute ({b['span']:.1f} s, {b['failed']:.0f} failed); request -> start "
              f"p50 {b['start_p50']:.2f} s max {b['start_max']:.2f} s; request -> done p50 {b['done_p50']:.2f} s "
              f"p99 {b['done_p99']:.2f} s (load average {os.getloadavg()[0]:.2f})")  # fmt: skip
    if not rows:
        print(f"{config}: no request completed")
        return
    warm, at_once = sum(r["warm"] for r in rows), sum(r["at_once"] for r in rows)
    print(f"{config}: request -> run start through dagster dev ({'Postgres' if postgres else 'SQLite'} instance), "
          f"{len(rows)} requests, {warm:.0f} warm launches, {at_once:.0f} not queued "
          f"(load average {os.getloadavg()[0]:.2f})")  # fmt: skip
    print(f"  {'stage':<56} {'p50 s':>7} {'max s':>7}")
    labels = {"created": "request -> run created (sensor)", "tick_wait": "  request -> its tick starts (0: seen by a waiting tick)",
              "tick_to_created": "  tick or request -> run created", "queued": "created -> starting (queue or at once)",
              "boot": "starting -> started (run worker)", "process": "  starting -> worker's first event (launch, fork)",
              "process_to_start": "  worker's first event -> RUN_START", "total": "request -> run started",
              "first_op": "started -> first op starts"}  # fmt: skip
    for key, label in labels.items():
        vals = [r[key] for r in rows]
        print(f"  {label:<56} {statistics.median(vals):7.2f} {max(vals):7.2f}")
    p50 = statistics.median(r["total"] for r in rows)
    print(
        f"  p50 request-to-start {p50:.2f} s   target <= {TARGET_S:g} s: {'PASS' if p50 <= TARGET_S else 'MISS'}"
    )


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=8)
    ap.add_argument("--timeout", type=float, default=300)
    ap.add_argument("--config", choices=("before", "after", "both"), default="both")
    ap.add_argument("--postgres", action="store_true", help="the Dagster instance on the local Postgres")
    ap.add_argument("--no-boot-cpu", action="store_true", help="skip the CPU measurement of the boot")
    ap.add_argument(
        "--burst", type=int, default=0, help="then N requests at once: runs per minute through Dagster"
    )
    ap.add_argument("--before-tree", type=Path, help="'before' is this checkout's code and dagster.yaml (e.g. a"
                    " worktree of main's previous commit), not Dagster's default launcher")  # fmt: skip
    ap.add_argument(
        "--rounds", type=int, default=1, help="alternate before/after this many times, rows pooled"
    )
    ap.add_argument(
        "--side-by-side", action="store_true", help="both dagster dev up at once, requests alternating"
    )
    args = ap.parse_args(argv)
    print(f"load average at start {os.getloadavg()[0]:.2f}")
    if not args.no_boot_cpu:
        b = boot_cpu()
        print(f"run worker boot, CPU seconds (median of 3): new interpreter {b['cold']:.2f}, "
              f"with the playbook cache {b['cold_cached']:.2f}, forked from a warm process {b['warm']:.2f} "
              f"(load average {os.getloadavg()[0]:.2f})")  # fmt: skip
    configs = ("before", "after") if args.config == "both" else (args.config,)
    results: dict[str, tuple[list[dict[str, float]], dict[str, float] | None]] = {
        c: ([], None) for c in configs
    }
    if args.side_by_side and len(configs) == 2:
        pooled = measure_side_by_side(
            args.requests, args.timeout, configs, args.postgres, {"before": args.before_tree}
        )
        results = {c: (pooled[c], None) for c in configs}
    for _ in range(0 if args.side_by_side else args.rounds):  # interleaved: load changes hit both alike
        for c in configs:
            rows, b = measure(args.requests, args.timeout, c, args.postgres, args.burst,
                              args.before_tree if c == "before" else None)  # fmt: skip
            results[c] = (results[c][0] + rows, b or results[c][1])
    for c in configs:
        _report(c, *results[c], args.postgres)
    if len(configs) == 2 and all(results[c][0] for c in configs):
        b, a = (statistics.median(r["total"] for r in results[c][0]) for c in configs)
        bb, ab = (statistics.median(r["boot"] for r in results[c][0]) for c in configs)
        print(f"after / before: request-to-start p50 {a / b:.2f}x, boot p50 {ab / bb:.2f}x")


if __name__ == "__main__":
    main()
