"""Materialize against the job path through ``dagster dev`` (issue 42 §1): launch-to-success seconds.

Starts the real ``dagster dev`` (webserver + daemon, each tree's ``example_project/dagster.yaml``) on
a code location of one daily-partitioned playbook of three steps (a table whose rows depend on the
day, a summary of it with checks on both, a last step), and launches through GraphQL, as the UI does:

- ``job``: the playbook's job for one partition (``launchRun``, tag ``dagster/partition``);
- ``materialize``: both tables for one partition (``__ASSET_JOB`` with the asset selection: the
  catalog's *Materialize*), with their checks;
- ``backfill``: the tables for three partitions (``launchPartitionBackfill``: the daemon launches it),
  from the request to its last run's end.

A run's seconds are its record's creation to its end (Launch to success); a backfill's also show
the wait for the backfill daemon's loop (request to the first run's record: Dagster's 30 s loop, 2 s
with ``backfill_loop_seconds: 2`` in the tree's dagster.yaml). Two trees side by side,
both ``dagster dev`` up at once and the launches alternating between them (the machine is shared:
compare, don't read absolute times): ``before`` is ``--compare REV`` (default ``main``'s commit before
issue 42: ``git archive``), ``after`` this checkout. Targets: materialize <= 1.5x job, backfill of
three <= 3.5x one materialize.

Run: ``python -m benchmarks.bench_assets [--rounds N] [--compare REV|DIR] [--only after]``.
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
BEFORE_REV = "d0880ad"  # main before issue 42 (the asset jobs on Dagster's multiprocess executor)
TARGETS = {"materialize / job": 1.5, "backfill of 3 / materialize": 3.5}
READINGS = "noetl://demo/examples/t/dataset/meter_readings"
SUMMARY = "noetl://demo/examples/t/dataset/daily_summary"

PLAYBOOK = f"""\
apiVersion: noetl.io/v2
kind: Playbook
metadata: {{name: meter_daily, path: bench/meter_daily}}
executor:
  spec:
    dagster:
      partitions: {{daily: 2026-01-01, workload_key: day}}
workload: {{day: "2026-01-01"}}
workflow:
  - step: start
    tool:
      - readings:
          kind: python
          input: {{day: "{{{{ workload.day }}}}"}}
          code: |
            def main(day):
                return [{{"day": day, "meter": m, "kwh": m * 1.5}} for m in range(int(day[-2:]) * 10)]
      - save: {{kind: parquet, uri: {READINGS}, data: "{{{{ readings }}}}"}}
    outputs:
      - uri: {READINGS}
        checks:
          - {{row_count: {{min: 1}}}}
    next:
      arcs: [{{step: summarize}}]
  - step: summarize
    tool:
      - readings: {{kind: parquet, op: read, uri: {READINGS}}}
      - save:
          kind: parquet
          uri: {SUMMARY}
          data: [{{day: "{{{{ workload.day }}}}", meters: "{{{{ readings.row_count }}}}"}}]
    outputs:
      - uri: {SUMMARY}
        checks:
          - {{row_count: {{min: 1, max: 1}}}}
    next:
      arcs: [{{step: report}}]
  - step: report
    tool: {{kind: python, code: "result = 'done'"}}
"""

DEFS = """\
import os
from noetl_dagster.resources.noetl import NoetlResource
from noetl_dagster.translator import compile_playbooks
defs = compile_playbooks([os.environ["BENCH_ASSETS_PLAYBOOK"]], include_sensor=False,
                         resource=NoetlResource(data_dir=os.environ["NOETL_DAGSTER_HOME"], tenant="demo",
                                                project="examples")).definitions
"""

BACKFILL = """
mutation($params: LaunchBackfillParams!) {
  launchPartitionBackfill(backfillParams: $params) {
    __typename
    ... on LaunchBackfillSuccess { backfillId }
    ... on PythonError { message }
    ... on InvalidStepError { invalidStepKey }
    ... on UnauthorizedError { message }
  }
}
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _checkout(compare: str, tmp: Path) -> Path:
    """``--compare``'s tree: a directory as given, else the git revision's tree extracted under ``tmp``."""
    if Path(compare).is_dir():
        return Path(compare).resolve()
    dest = tmp / "compare"
    dest.mkdir()
    tar = subprocess.run(["git", "-C", str(REPO), "archive", compare], capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(dest)], input=tar, check=True)
    return dest


ASSETS = "{ assetNodes { assetKey { path } } }"


class _Session:
    """One ``dagster dev`` of a tree on its own DAGSTER_HOME and NoETL data directory."""

    def __init__(self, name: str, tree: Path):
        self.name, self.tree = name, tree
        self.tmp = Path(tempfile.mkdtemp(prefix=f"bench_assets_{name}_"))
        home, noetl = self.tmp / "dagster_home", self.tmp / "noetl"
        home.mkdir()
        shutil.copy(tree / "example_project" / "dagster.yaml", home / "dagster.yaml")
        (self.tmp / "meter_daily.yaml").write_text(PLAYBOOK)
        (self.tmp / "bench_defs.py").write_text(DEFS)
        env = {**os.environ, "DAGSTER_HOME": str(home), "NOETL_DAGSTER_HOME": str(noetl),
               "BENCH_ASSETS_PLAYBOOK": str(self.tmp / "meter_daily.yaml"),
               "PYTHONPATH": os.pathsep.join([str(tree), str(self.tmp)])}  # fmt: skip
        env.pop("NOETL_DAGSTER_EXECUTOR", None)
        self.port = _free_port()
        self.log = open(self.tmp / "dagster_dev.log", "wb")  # noqa: SIM115 - closed in close()
        self.proc = subprocess.Popen(  # its own process group: dagster dev ignores signals otherwise
            [str(Path(sys.executable).parent / "dagster"), "dev", "-f", "bench_defs.py", "-h", "127.0.0.1",
             "-p", str(self.port)],
            cwd=self.tmp, env=env, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
        self.home, self.instance, self.client, self.keys = home, None, None, []

    def ready(self) -> None:
        import dagster as dg
        import httpx
        from dagster_graphql import DagsterGraphQLClient

        deadline = time.time() + 300
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError((self.tmp / "dagster_dev.log").read_text()[-2000:])
            try:
                if httpx.get(f"http://127.0.0.1:{self.port}/server_info", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.time() > deadline:
                raise RuntimeError(f"dagster dev ({self.name}) did not answer in 300 s")
            time.sleep(0.5)
        self.instance = dg.DagsterInstance.from_config(str(self.home))
        self.client = DagsterGraphQLClient("127.0.0.1", port_number=self.port, timeout=120)
        # the tables' keys as this tree's translator names them (the default key changed in issue 42's time)
        nodes = self.client._execute(ASSETS)["assetNodes"]  # noqa: SLF001
        self.keys = [
            n["assetKey"]["path"]
            for n in nodes
            if n["assetKey"]["path"][-1] in ("meter_readings", "daily_summary")
        ]

    def _wait(self, run_ids: list[str], timeout: float = 600) -> list[float]:
        """Each run's seconds from its record's creation to its end; raises unless all succeeded."""
        import dagster as dg

        deadline = time.time() + timeout
        while time.time() < deadline:
            recs = [self.instance.get_run_record_by_id(r) for r in run_ids]
            if all(r is not None and r.dagster_run.is_finished for r in recs):
                bad = [
                    r.dagster_run.run_id for r in recs if r.dagster_run.status != dg.DagsterRunStatus.SUCCESS
                ]
                if bad:
                    raise RuntimeError(
                        f"{self.name}: runs {bad} did not succeed (see {self.tmp}/dagster_dev.log)"
                    )
                return [r.create_timestamp.timestamp() for r in recs] + [r.end_time for r in recs]
            time.sleep(0.2)
        raise RuntimeError(f"{self.name}: runs {run_ids} not finished in {timeout:.0f} s")

    def job(self, day: str) -> float:
        rid = self.client.submit_job_execution("meter_daily", tags={"dagster/partition": day})
        t = self._wait([rid])
        return t[1] - t[0]

    def materialize(self, day: str) -> float:
        import dagster as dg

        keys = [dg.AssetKey(k) for k in self.keys]
        rid = self.client.submit_job_execution(
            "__ASSET_JOB", asset_selection=keys, tags={"dagster/partition": day}
        )
        t = self._wait([rid])
        return t[1] - t[0]

    def backfill(self, days: list[str]) -> tuple[float, int, float]:
        """Seconds from the request to the last run's end, the number of runs, and the seconds from the
        request to the first run's record (the backfill daemon's pickup)."""
        import dagster as dg
        from dagster._core.execution.backfill import BulkActionStatus

        t0 = time.time()
        params = {"partitionNames": days, "assetSelection": [{"path": k} for k in self.keys]}
        out = self.client._execute(BACKFILL, {"params": params})["launchPartitionBackfill"]  # noqa: SLF001
        if out["__typename"] != "LaunchBackfillSuccess":
            raise RuntimeError(f"{self.name}: backfill refused: {out}")
        bid = out["backfillId"]
        deadline = time.time() + 900
        while time.time() < deadline:
            bf = self.instance.get_backfill(bid)
            if bf.status not in (BulkActionStatus.REQUESTED,):
                break
            time.sleep(0.2)
        runs = self.instance.get_runs(dg.RunsFilter(tags={"dagster/backfill": bid}))
        if bf.status != BulkActionStatus.COMPLETED_SUCCESS or not runs:
            raise RuntimeError(f"{self.name}: backfill {bid} ended {bf.status} with {len(runs)} runs")
        times = self._wait([r.run_id for r in runs])
        starts, ends = times[: len(runs)], times[len(runs) :]
        return max(ends) - t0, len(runs), min(starts) - t0

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


def measure(trees: dict[str, Path], rounds: int) -> dict[str, dict[str, list[float]]]:
    """Per tree: job, materialize and backfill seconds of each round (and the backfill's run count)."""
    sessions: dict[str, _Session] = {}
    rows: dict[str, dict[str, list[float]]] = {
        n: {"job": [], "materialize": [], "backfill": [], "runs": [], "pickup": []} for n in trees
    }
    try:
        for n, tree in trees.items():
            sessions[n] = _Session(n, tree)
        for s in sessions.values():
            s.ready()
            s.job("2026-02-01")  # warm-up: the first launch loads the code location in the launcher
            s.materialize("2026-02-02")
        for i in range(rounds):
            day = f"2026-03-{i * 5 + 1:02d}"
            order = list(sessions.values()) if i % 2 == 0 else list(reversed(sessions.values()))
            for s in order:
                rows[s.name]["job"].append(s.job(day))
                rows[s.name]["materialize"].append(s.materialize(f"2026-04-{i * 5 + 1:02d}"))
                took, runs, pickup = s.backfill([f"2026-05-{i * 5 + k:02d}" for k in (1, 2, 3)])
                rows[s.name]["backfill"].append(took)
                rows[s.name]["runs"].append(float(runs))
                rows[s.name]["pickup"].append(pickup)
                print(f"  round {i + 1} {s.name}: job {rows[s.name]['job'][-1]:.2f} s, materialize "
                      f"{rows[s.name]['materialize'][-1]:.2f} s, backfill of 3 {took:.2f} s in {runs} run(s), "
                      f"{pickup:.2f} s of it before the first run "
                      f"(load {os.getloadavg()[0]:.1f})", flush=True)  # fmt: skip
        return rows
    finally:
        for s in sessions.values():
            s.close()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--compare", default=BEFORE_REV, metavar="REV|DIR", help="the 'before' tree")
    ap.add_argument("--only", choices=("before", "after"), help="measure one tree")
    args = ap.parse_args(argv)
    print(f"load average at start {os.getloadavg()[0]:.2f}")
    with tempfile.TemporaryDirectory(prefix="bench_assets_trees_") as d:
        trees = {"before": _checkout(args.compare, Path(d)), "after": REPO}
        if args.only:
            trees = {args.only: trees[args.only]}
        rows = measure(trees, args.rounds)
    for name, r in rows.items():
        job, mat, bf, pick = (statistics.median(r[k]) for k in ("job", "materialize", "backfill", "pickup"))
        ratios = {"materialize / job": mat / job, "backfill of 3 / materialize": bf / mat}
        print(f"{name}: medians of {args.rounds}: job {job:.2f} s, materialize {mat:.2f} s, "
              f"backfill of 3 {bf:.2f} s ({statistics.median(r['runs']):.0f} run(s); {pick:.2f} s to the first run)")  # fmt: skip
        for k, v in ratios.items():
            print(f"  {k} {v:.2f}x (target <= {TARGETS[k]}x: {'ok' if v <= TARGETS[k] else 'MISS'})")
    if len(rows) == 2:
        b, a = rows["before"], rows["after"]
        for k in ("materialize", "backfill"):
            print(f"after / before {k}: {statistics.median(a[k]) / statistics.median(b[k]):.2f}x")


if __name__ == "__main__":
    main()
