"""Usage that misses nothing (issue 30.3): CPU of the threads a task starts, the peak of an
attempt after a bigger earlier one in the same process, the memory of an isolated child,
the bytes of the storage tasks, and the engine's own CPU as the execution's ``platform``
usage in ``workflow.finished`` (tasks + platform = the process's CPU). Real runs, no mocks."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from noetl_analytics.pricing import usage_lines
from noetl_dagster.runners.local import run_playbook
from noetl_dagster.storage.event_stores import open_event_store

MB = 1024 * 1024
HEAD = (
    "apiVersion: noetl.io/v2\nkind: Playbook\nmetadata: {name: usage_all, path: tests/usage_all}\nworkflow:\n"
)


def _write(tmp_path: Path, workflow: str, name: str = "usage.yaml") -> Path:
    pb = tmp_path / name
    pb.write_text(HEAD + textwrap.dedent(workflow), encoding="utf-8")
    return pb


def _events(url: str, execution_id: str) -> list:
    store = open_event_store(url)
    try:
        return store.read(execution_id)
    finally:
        store.close()


def _run(tmp_path: Path, workflow: str, workload=None, **kw):
    pb = _write(tmp_path, workflow)
    cpu0 = time.process_time()
    res = run_playbook(
        pb, workload, data_dir=tmp_path / "data", event_store=f"sqlite:///{tmp_path / 'events.db'}", **kw
    )
    spent = time.process_time() - cpu0
    events = _events(res.event_store_url, res.execution_id)
    return res, events, spent


def _usage(events) -> dict[str, dict]:
    return {e.data["task"]: e.data["outcome"]["meta"]["usage"] for e in events if e.name == "task.done"}


def _platform(events) -> dict:
    [fin] = [e for e in events if e.name == "workflow.finished"]
    return fin.data["platform"]


BURN_THREADS = """
  - step: start
    tool:
      - threads:
          kind: python
          code: |
            import hashlib, threading, time
            block = b"x" * (1 << 20)
            spent = []
            def burn():
                t0 = time.thread_time()
                h = hashlib.sha256()
                while time.thread_time() - t0 < 0.6:  # CPU seconds, whatever the machine's load
                    h.update(block)
                spent.append(time.thread_time() - t0)
            threads = [threading.Thread(target=burn) for _ in range(2)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            result = {"thread_cpu_s": sum(spent)}
"""


def test_cpu_of_the_threads_a_task_starts_is_the_tasks(tmp_path):
    res, events, spent = _run(tmp_path, BURN_THREADS)
    assert res.status == "completed", res.results
    u = _usage(events)["threads"]
    burned = res.results["start"]["thread_cpu_s"]  # what the two threads measured themselves
    assert burned >= 1.2
    assert u["cpu_s"] >= burned, (u, burned)  # the calling thread only waited: it was 0.0x before
    # nothing counted twice or lost: the task and the platform line are the process's CPU
    p = _platform(events)
    assert u["cpu_s"] + p["cpu_s"] <= spent + 0.01
    assert u["cpu_s"] + p["cpu_s"] >= 0.9 * spent


def test_a_smaller_peak_after_a_bigger_one_in_the_same_process_is_measured(tmp_path):
    res, events, _ = _run(
        tmp_path,
        """
      - step: start
        tool:
          - big:
              kind: python
              code: |
                blob = b"x" * (300 * 1024 * 1024)
                del blob
                result = 1
          - small:
              kind: python
              code: |
                blob = b"y" * (200 * 1024 * 1024)
                del blob
                result = 2
    """,
    )
    assert res.status == "completed", res.results
    u = _usage(events)
    # the 300 MB step left the process high-water mark above anything the 200 MB step reaches
    assert u["big"]["mem_delta_bytes"] >= 290 * MB, u["big"]
    assert 190 * MB <= u["small"]["mem_delta_bytes"] < 290 * MB, u["small"]
    assert u["small"]["mem_peak_bytes"] - u["small"]["mem_delta_bytes"] >= 0
    # the meter reset the process's mark before `small`; a whole run's peak is still there to read
    from noetl_dagster.engine.usage import process_peak_bytes

    assert (
        process_peak_bytes()
        >= u["big"]["mem_peak_bytes"]
        > resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    )


def test_memory_of_an_isolated_child_is_measured_and_priced(tmp_path):
    res, events, _ = _run(
        tmp_path,
        """
      - step: start
        tool:
          - bigger_child:
              kind: python
              spec: {isolation: process, timeout: 60}
              code: |
                blob = b"x" * (300 * 1024 * 1024)
                result = len(blob)
          - child:
              kind: python
              spec: {isolation: process, timeout: 60}
              code: |
                blob = b"x" * (200 * 1024 * 1024)
                result = len(blob)
    """,
    )
    assert res.status == "completed", res.results
    task_done = {e.data["task"]: e for e in events if e.name == "task.done"}
    u = _usage(events)
    # the child's own peak (wait4), not the largest child the process ever reaped (300 MB)
    assert 200 * MB <= u["child"]["child_maxrss_bytes"] < 290 * MB, u["child"]
    assert u["bigger_child"]["child_maxrss_bytes"] >= 300 * MB
    # the memory the attempt added includes its child's: what RAM is priced on
    assert u["child"]["mem_delta_bytes"] >= u["child"]["child_maxrss_bytes"]
    e = task_done["child"]
    ram = next(line for line in usage_lines(e.name, e.data) if line.category == "ram")
    duration_h = e.data["outcome"]["meta"]["duration_ms"] / 3.6e6
    assert ram.quantity * 1e9 >= 200 * MB * duration_h > 0  # GB-hours


def test_storage_tasks_count_the_bytes_they_write(tmp_path, data_dir):
    res, events, _ = _run(
        tmp_path,
        """
      - step: start
        tool:
          - pq:
              kind: parquet
              uri: noetl://acme/lab/sales/dataset/usage_pq
              data: "{{ workload.rows }}"
          - arr:
              kind: arrow
              resource: usage_arrow
              namespace: sales
              data: "{{ workload.rows }}"
          - ice:
              kind: iceberg
              resource: usage_ice
              namespace: sales
              data: {rows: "{{ workload.rows }}"}
    """,
        {"rows": [{"id": i, "amount": i * 1.5, "region": "eu" if i % 2 else "us"} for i in range(500)]},
        tenant="acme",
        project="lab",
    )
    assert res.status == "completed", res.results
    u = _usage(events)
    results = {e.data["task"]: e.data["outcome"]["result"] for e in events if e.name == "task.done"}
    for task in ("pq", "arr"):  # the file written is the bytes counted
        assert u[task]["bytes_written"] == results[task]["size"] > 0, (task, u[task], results[task])
    # Iceberg: the data files the snapshot added (its summary's added-files-size)
    assert u["ice"]["bytes_written"] > 0, u["ice"]
    assert u["ice"]["bytes_written"] == results["ice"]["size"]  # the first snapshot holds only these files


def test_platform_usage_is_recorded_on_workflow_finished(tmp_path):
    res, events, spent = _run(
        tmp_path,
        """
      - step: start
        tool:
          - burn: {kind: python, code: "result = sum(i * i for i in range(4_000_000))"}
        next: {arcs: [{step: more}]}
      - step: more
        tool:
          - a: {kind: noop}
          - b: {kind: python, code: "result = 1"}
    """,
    )
    assert res.status == "completed", res.results
    p = _platform(events)
    assert (
        set(p) >= {"cpu_s", "process_cpu_s", "task_cpu_s", "wall_s", "window"} and p["window"] == "execution"
    )
    assert p["cpu_s"] > 0  # routing, recording, templates: the engine's own work
    tasks = sum(u["cpu_s"] for u in _usage(events).values())
    assert abs(p["task_cpu_s"] - tasks) < 1e-5
    assert abs(p["process_cpu_s"] - (p["cpu_s"] + p["task_cpu_s"] + p["other_cpu_s"])) < 1e-5
    assert tasks + p["cpu_s"] <= spent + 0.01
    assert tasks + p["cpu_s"] >= 0.8 * spent


def test_parallel_attempts_lose_nothing(tmp_path):
    """Overlapping attempts each measure their own thread; the rest of the process's CPU is the
    platform line, so tasks + platform still equal the process's CPU."""
    res, events, spent = _run(
        tmp_path,
        """
      - step: start
        loop:
          in: "{{ [1, 2, 3, 4] }}"
          iterator: n
          spec: {mode: parallel, max_in_flight: 2}
        tool:
          - burn: {kind: python, code: "result = sum(i * i for i in range(1_500_000))"}
    """,
    )
    assert res.status == "completed", res.results
    tasks = sum(e.data["outcome"]["meta"]["usage"]["cpu_s"] for e in events if e.name == "task.done")
    p = _platform(events)
    assert tasks > 0 and p["cpu_s"] > 0
    assert tasks + p["cpu_s"] <= spent + 0.01
    assert tasks + p["cpu_s"] >= 0.8 * spent


def test_a_sub_playbook_is_not_counted_twice(tmp_path):
    sub = tmp_path / "sub"
    sub.mkdir()
    (sub / "child.yaml").write_text(
        "apiVersion: noetl.io/v2\nkind: Playbook\nmetadata: {name: child, path: tests/usage_child}\n"
        'workflow:\n  - step: start\n    tool:\n      - burn: {kind: python, code: "result = sum(i * i for i in range(4_000_000))"}\n',
        encoding="utf-8",
    )
    res, events, spent = _run(
        tmp_path,
        """
      - step: start
        tool:
          - call:
              kind: playbook
              path: ./sub/child.yaml
    """,
    )
    assert res.status == "completed", res.results
    child_id = res.results["start"]["execution_id"]
    child_events = _events(res.event_store_url, child_id)
    child_burn = _usage(child_events)["burn"]["cpu_s"]
    child_platform = _platform(child_events)["cpu_s"]
    call = _usage(events)["call"]["cpu_s"]
    assert child_burn > 0.05 and child_platform > 0
    assert call < child_burn  # the parent's task is not charged its child's work again
    total = call + _platform(events)["cpu_s"] + child_burn + child_platform
    assert total <= spent + 0.01
    assert total >= 0.8 * spent


def test_a_cli_run_charges_its_process_start_up_to_the_execution(tmp_path):
    pb = _write(tmp_path, "  - step: start\n    tool: {kind: python, code: 'result = 1'}\n")
    home = tmp_path / "home"
    env = {**os.environ, "NOETL_DAGSTER_HOME": str(home), "NO_COLOR": "1"}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    proc = subprocess.run([sys.executable, "-m", "noetl_dagster.commands.main", "run", str(pb), "--json"],
                          capture_output=True, text=True, env=env, timeout=120)  # fmt: skip
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    assert proc.returncode == 0, proc.stderr
    child_cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    eid = json.loads(proc.stdout)["execution_id"]
    p = _platform(_events(f"local://{home / 'local'}", eid) or [])
    assert p["window"] == "process"
    # interpreter start-up and imports are this execution's: most of the process's CPU
    assert p["process_cpu_s"] <= child_cpu + 0.01
    assert p["process_cpu_s"] >= 0.5 * child_cpu
    assert p["cpu_s"] >= p["process_cpu_s"] - p["task_cpu_s"] - 1e-5 and p["cpu_s"] > 0.1


def test_shell_children_are_measured_each_by_wait4(tmp_path):
    """Not only the python runner's own report: a shell task's child reaped with wait4 gives its own
    peak, not the largest child the process reaped before (RUSAGE_CHILDREN's mark). A child's kernel
    mark starts at the worker's, so the children here are sized above the worker's resident set."""
    worker = int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    big, small = worker + 300 * MB, worker + 200 * MB
    res, events, _ = _run(
        tmp_path,
        """
      - step: start
        tool:
          - big: {kind: shell, cmd: "{{ workload.py }} -c \\"b = b'x' * {{ workload.big }}\\""}
          - small: {kind: shell, cmd: "{{ workload.py }} -c \\"b = b'x' * {{ workload.small }}\\""}
    """,
        {"py": sys.executable, "big": big, "small": small},
    )
    assert res.status == "completed", res.results
    u = _usage(events)
    assert u["big"]["child_maxrss_bytes"] >= big, u["big"]
    assert small <= u["small"]["child_maxrss_bytes"] < big, u["small"]
    assert u["small"]["mem_delta_bytes"] >= u["small"]["child_maxrss_bytes"]


def test_parallel_attempts_do_not_share_each_others_children(tmp_path):
    """RUSAGE_CHILDREN is process-wide: two lanes reaping children at once would each count both.
    Beside other attempts an attempt counts only the children it reaped itself (wait4)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    res, events, _ = _run(
        tmp_path,
        """
      - step: start
        loop:
          in: "{{ [1, 2, 3, 4] }}"
          iterator: n
          spec: {mode: parallel, max_in_flight: 2}
        tool:
          - sh: {kind: shell, cmd: "i=0; while [ $i -lt 60000 ]; do i=$((i+1)); done"}
    """,
    )
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    assert res.status == "completed", res.results
    reaped = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    counted = [
        e.data["outcome"]["meta"]["usage"].get("child_cpu_s", 0) for e in events if e.name == "task.done"
    ]
    assert len(counted) == 4 and all(c > 0 for c in counted), counted
    assert sum(counted) <= reaped + 0.005, (counted, reaped)
    assert sum(counted) >= 0.9 * reaped, (counted, reaped)


def test_parallel_sub_playbooks_are_not_counted_twice(tmp_path):
    """Sub-executions running at once on parallel lanes: each window sees the other's CPU. What an
    attempt or an earlier-closed window already took is not taken again, so over the parent and its
    children, tasks + platform lines = the process's CPU."""
    sub = tmp_path / "sub"
    sub.mkdir()
    (sub / "child.yaml").write_text(
        "apiVersion: noetl.io/v2\nkind: Playbook\nmetadata: {name: child, path: tests/usage_child}\n"
        'workflow:\n  - step: start\n    tool:\n      - wait: {kind: python, code: "import time\\ntime.sleep(0.3)\\nresult = 1"}\n'
        '      - burn: {kind: python, code: "result = sum(i * i for i in range(1_500_000))"}\n',
        encoding="utf-8",
    )
    res, events, spent = _run(
        tmp_path,
        """
      - step: start
        loop:
          in: "{{ [1, 2, 3, 4] }}"
          iterator: n
          spec: {mode: parallel, max_in_flight: 2}
        tool:
          - call: {kind: playbook, path: ./sub/child.yaml}
    """,
    )
    assert res.status == "completed", res.results
    children = [r["execution_id"] for r in res.results["start"]["results"]]
    assert len(set(children)) == 4
    total, platforms = 0.0, []
    for evs in [events] + [_events(res.event_store_url, c) for c in children]:
        total += sum(e.data["outcome"]["meta"]["usage"]["cpu_s"] for e in evs if e.name == "task.done")
        platforms.append(_platform(evs)["cpu_s"])
        total += platforms[-1]
    assert all(p >= 0 for p in platforms)
    assert total <= spent + 0.01, (total, spent, platforms)
    assert total >= 0.8 * spent, (total, spent, platforms)
