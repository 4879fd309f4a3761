"""Dagster translator benchmarks (issue 4).

1. A 50-step linear playbook (each step a python task adding one to the
   previous step's result) as one Dagster run, next to a hand-written Dagster
   job of 50 ops doing the same additions; both ``execute_in_process`` on the
   same instance type (a SQLite instance in a temporary DAGSTER_HOME), median
   of several runs. Target: ratio <= 1.2.
2. The countdown cycle with 20 iterations: one run (the cycle is one region
   op), next to the same 20 iterations chained the way Dagster chains runs
   without the translator, a ``run_status_sensor`` launching the next run when
   one succeeds (each sensor evaluation driven in-process here, so no daemon
   tick interval is counted: the figure is a lower bound for the chain).
   Both wall times are reported, and their ratio.
3. Translating 200 playbooks (already parsed) into ``dg.Definitions``.
   Target: <= 2 s.

Run: ``python -m benchmarks.bench_dagster`` or ``python -m benchmarks --only dagster``.
Always exits 0; read PASS / MISS.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

LINEAR_TARGET = 1.2
TRANSLATE_TARGET_S = 2.0
REPO = Path(__file__).resolve().parents[1]


def _linear_playbook(n: int):
    from noetl_dagster.dsl import load_playbook_dict

    steps = []
    for i in range(n):
        prev = f"{{{{ s{i - 1}.n }}}}" if i else "0"
        step = {
            "step": f"s{i}",
            "tool": [
                {f"add{i}": {"kind": "python", "input": {"n": prev}, "code": "result = {'n': int(n) + 1}"}}
            ],
        }
        if i + 1 < n:
            step["next"] = {"arcs": [{"step": f"s{i + 1}"}]}
        steps.append(step)
    doc = {"apiVersion": "noetl.io/v2", "kind": "Playbook", "metadata": {"name": "linear50", "path": "bench/linear50"},
           "workflow": steps}  # fmt: skip
    return load_playbook_dict(doc)


def _hand_written_job(n: int, *, values: bool = True):
    """50 ops adding one each; ``values=False`` chains them with Nothing deps (no IO manager at all)."""
    import dagster as dg

    if not values:
        code = compile("result = {'n': int(n) + 1}", "<add>", "exec")
        box = {"n": 0}

        def make_plain(i: int) -> dg.OpDefinition:
            @dg.op(name=f"add{i}", ins={"after": dg.In(dg.Nothing)} if i else {})
            def plain() -> None:
                scope = {"n": box["n"] if i else 0}
                exec(code, scope)
                box["n"] = scope["result"]["n"]

            return plain

        deps = {f"add{i}": {"after": dg.DependencyDefinition(f"add{i - 1}", "result")} for i in range(1, n)}
        graph = dg.GraphDefinition(name="hand_written_plain", node_defs=[make_plain(i) for i in range(n)],
                                   dependencies=deps)  # fmt: skip
        return graph.to_job(executor_def=dg.in_process_executor)

    def make(i: int) -> dg.OpDefinition:
        code = compile("result = {'n': int(n) + 1}", f"<add{i}>", "exec")

        if i == 0:

            @dg.op(name=f"add{i}")
            def first() -> dict:
                scope = {"n": 0}
                exec(code, scope)  # the same work as the playbook's python task
                return scope["result"]

            return first

        @dg.op(name=f"add{i}")
        def nxt(prev: dict) -> dict:
            scope = {"n": prev["n"]}
            exec(code, scope)
            return scope["result"]

        return nxt

    ops = [make(i) for i in range(n)]
    deps = {f"add{i}": {"prev": dg.DependencyDefinition(f"add{i - 1}", "result")} for i in range(1, n)}
    graph = dg.GraphDefinition(name="hand_written_linear", node_defs=ops, dependencies=deps)
    return graph.to_job(executor_def=dg.in_process_executor)


def _timed(fn, repeat: int) -> list[float]:
    out = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def bench_linear(n: int, repeat: int) -> tuple[float, float, float]:
    import dagster as dg

    from noetl_dagster.resources.noetl import NoetlResource
    from noetl_dagster.translator import compile_playbooks

    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp) / "dagster_home"
        home.mkdir()
        instance = dg.DagsterInstance.from_config(str(home))
        loc = compile_playbooks([_linear_playbook(n)], resource=NoetlResource(data_dir=str(Path(tmp) / "noetl")),
                                include_sensor=False)  # fmt: skip
        noetl_job = loc.definitions.resolve_job_def(
            "linear50" if n == 50 else loc.index.playbooks[0].job_name
        )
        hand_job = _hand_written_job(n)
        plain_job = _hand_written_job(n, values=False)
        quiet = {"loggers": {"console": {"config": {"log_level": "ERROR"}}}}

        def run_noetl():
            r = noetl_job.execute_in_process(instance=instance, run_config=quiet)
            assert r.success

        def run_hand():
            r = hand_job.execute_in_process(instance=instance, run_config=quiet)
            assert r.success
            assert r.output_for_node(f"add{n - 1}") == {"n": n}

        def run_plain():
            assert plain_job.execute_in_process(instance=instance, run_config=quiet).success

        run_noetl(), run_hand(), run_plain()  # warm-up: imports, tool registry, code caches
        noetl_t, hand_t, plain_t = [], [], []
        for _ in range(repeat):  # interleaved, so machine load hits all alike
            noetl_t += _timed(run_noetl, 1)
            hand_t += _timed(run_hand, 1)
            plain_t += _timed(run_plain, 1)
        instance.dispose()
    return statistics.median(noetl_t), statistics.median(hand_t), statistics.median(plain_t)


def bench_cycle(iterations: int) -> tuple[float, float]:
    import dagster as dg

    from noetl_dagster.dsl import load_playbook
    from noetl_dagster.resources.noetl import NoetlResource
    from noetl_dagster.translator import compile_playbooks

    pb = load_playbook(REPO / "example_project" / "playbooks" / "countdown_cycle.yaml")
    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp) / "dagster_home"
        home.mkdir()
        instance = dg.DagsterInstance.from_config(str(home))
        loc = compile_playbooks(
            [pb], resource=NoetlResource(data_dir=str(Path(tmp) / "noetl")), include_sensor=False
        )
        job = loc.definitions.resolve_job_def("countdown_cycle")
        cfg = {"loggers": {"console": {"config": {"log_level": "ERROR"}}},
               "ops": {"noetl_start": {"config": {"workload": {"count": iterations}}}}}  # fmt: skip
        job.execute_in_process(instance=instance, run_config=cfg)  # warm-up
        t0 = time.perf_counter()
        r = job.execute_in_process(instance=instance, run_config=cfg)
        one_run = time.perf_counter() - t0
        assert r.success

        # the same iterations chained run by run: a one-op job decrements a counter, and a
        # run_status_sensor requests the next run while the counter is positive
        @dg.op(config_schema={"n": int})
        def tick(context) -> int:  # noqa: ANN001
            return context.op_config["n"] - 1

        tick_job = dg.GraphDefinition(name="tick_job", node_defs=[tick]).to_job(
            executor_def=dg.in_process_executor
        )

        @dg.run_status_sensor(
            run_status=dg.DagsterRunStatus.SUCCESS, monitored_jobs=[tick_job], request_job=tick_job
        )
        def chain(context):  # noqa: ANN001
            n = context.dagster_run.run_config["ops"]["tick"]["config"]["n"] - 1
            if n > 0:
                return dg.RunRequest(run_key=None, run_config={"ops": {"tick": {"config": {"n": n}}}})
            return dg.SkipReason("done")

        def run_tick(n: int) -> dg.ExecuteInProcessResult:
            return tick_job.execute_in_process(instance=instance, run_config={
                "loggers": {"console": {"config": {"log_level": "ERROR"}}}, "ops": {"tick": {"config": {"n": n}}}})  # fmt: skip

        run_tick(1)  # warm-up
        t0 = time.perf_counter()
        result = run_tick(iterations)
        runs = 1
        while True:
            ctx = dg.build_run_status_sensor_context(
                sensor_name="chain", dagster_instance=instance, dagster_run=result.dagster_run,
                dagster_event=result.get_run_success_event(),
            )  # fmt: skip
            req = chain(ctx)
            if not isinstance(req, dg.RunRequest):
                break
            result = run_tick(req.run_config["ops"]["tick"]["config"]["n"])
            runs += 1
        chained = time.perf_counter() - t0
        assert runs == iterations
        instance.dispose()
    return one_run, chained


def bench_translate(n: int) -> float:
    from noetl_dagster.dsl import load_playbook
    from noetl_dagster.translator import compile_playbooks

    files = sorted((REPO / "example_project" / "playbooks").glob("*.yaml"))
    base = [load_playbook(f) for f in files]
    many = []
    for i in range(n):
        pb = base[i % len(base)].model_copy(deep=True)
        pb.metadata.name = f"{pb.metadata.name}_{i}"
        pb.metadata.path = f"{pb.metadata.path}_{i}"
        pb.source_file = None
        many.append(pb)
    compile_playbooks(many[:5])  # warm-up: imports
    t0 = time.perf_counter()
    loc = compile_playbooks(many)
    elapsed = time.perf_counter() - t0
    assert len(loc.index.playbooks) == n
    return elapsed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--iterations", type=int, default=20)
    ap.add_argument("--playbooks", type=int, default=200)
    args = ap.parse_args()
    os.environ.pop("DAGSTER_HOME", None)
    print(f"load average: {os.getloadavg()[0]:.2f} on {os.cpu_count()} cpus", flush=True)

    noetl_t, hand_t, plain_t = bench_linear(args.steps, args.repeat)
    ratio = noetl_t / hand_t
    verdict = "PASS" if ratio <= LINEAR_TARGET else "MISS"
    print(f"[1] {args.steps}-step linear, one run: playbook {noetl_t:.3f}s vs hand-written job {hand_t:.3f}s "
          f"(median of {args.repeat}) ratio {ratio:.2f} (target <= {LINEAR_TARGET}) {verdict}", flush=True)  # fmt: skip
    print(f"    hand-written job with Nothing deps (no values, no IO manager) {plain_t:.3f}s: ratio "
          f"{noetl_t / plain_t:.2f}", flush=True)  # fmt: skip

    one_run, chained = bench_cycle(args.iterations)
    print(f"[2] countdown cycle x{args.iterations}: one run {one_run:.3f}s; chained by run_status_sensor "
          f"{chained:.3f}s ({args.iterations} runs, in-process sensor evaluation, no daemon ticks); "
          f"ratio one-run/chained {one_run / chained:.2f}", flush=True)  # fmt: skip

    t = bench_translate(args.playbooks)
    verdict = "PASS" if t <= TRANSLATE_TARGET_S else "MISS"
    print(
        f"[3] translate {args.playbooks} playbooks: {t:.3f}s (target <= {TRANSLATE_TARGET_S}s) {verdict}",
        flush=True,
    )


if __name__ == "__main__":
    sys.exit(main())
