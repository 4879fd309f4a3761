"""kill -9 of a local-mode run at random points (issue 46 item 2): before, inside and after side
effects, with the default flush policy and with a flush at every append. Then ``resume`` continues
from the last flushed batch, a side effect never runs again for a step (or loop iteration) the log
showed finished when the process died, replay of the log equals the live result, and the chain
verifies. Real processes (the ``noetl-dagster`` CLI), real files."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from noetl_dagster.storage.feather_events import EVENTS_FILE, FeatherEventStore

ROOT = Path(__file__).resolve().parents[2]
ENV_PATH = os.pathsep.join(str(ROOT / p) for p in ("", "analytics", "lineage", "registry_service"))

# every python task appends a line to workload.path (an effect outside the execution), then sleeps:
# the kill lands before, inside or after an effect depending on the lines already written
PLAYBOOK = """\
apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: kill_probe, path: tests/local_kill_probe}
workload: {path: ""}
workflow:
  - step: start
    tool: {kind: python, input: {p: "{{ workload.path }}"}, code: "import time\\nopen(p, 'a').write('start\\\\n')\\ntime.sleep(0.03)\\nresult = 1"}
    next: {arcs: [{step: calc}]}
  - step: calc
    tool: {kind: noop, result: "{{ start + 1 }}"}
    next: {arcs: [{step: fx}]}
  - step: fx
    loop: {in: "{{ range(4) }}", iterator: i, spec: {mode: sequential}}
    tool: {kind: python, input: {p: "{{ workload.path }}", i: "{{ iter.i }}"}, code: "import time\\nopen(p, 'a').write(f'fx:{i}\\\\n')\\ntime.sleep(0.03)\\nresult = i * 10"}
    next: {arcs: [{step: end}]}
  - step: end
    tool: {kind: python, input: {p: "{{ workload.path }}", xs: "{{ fx.results }}"}, code: "open(p, 'a').write('end\\\\n')\\nresult = sum(xs)"}
"""
EFFECTS = ["start", "fx:0", "fx:1", "fx:2", "fx:3", "end"]
CASES: list[dict] = []  # what each example did, printed at the end (-s) for the report


def _env(home: Path, flush_bytes: int | None) -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": ENV_PATH, "NOETL_DAGSTER_HOME": str(home)}
    env.pop("NOETL_EVENT_STORE_URL", None)
    if flush_bytes:
        env["NOETL_LOCAL_FLUSH_BYTES"] = str(flush_bytes)
    return env


def _cli(home: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "noetl_dagster.commands.main", *args], env=_env(home, None),
                          capture_output=True, text=True, timeout=120)  # fmt: skip


def _effects(path: Path) -> Counter:
    return Counter(path.read_text().split()) if path.exists() else Counter()


def _finished(home: Path) -> tuple[str | None, set[str]]:
    """The execution id and the effects the log shows finished (read as a new process would)."""
    found = list((home / "local").glob(f"*/{EVENTS_FILE}")) if (home / "local").exists() else []
    if not found:
        return None, set()
    eid = found[0].parent.name
    done: set[str] = set()
    for e in FeatherEventStore(home / "local").read(eid):
        if e.name == "step.done" and e.step in ("start", "end"):
            done.add(e.step)
        elif e.name == "loop.iteration.done" and e.step == "fx":
            done.add(f"fx:{e.iteration}")
    return eid, done


@pytest.fixture(scope="module")
def playbook():
    d = Path(tempfile.mkdtemp(prefix="local-kill-"))
    pb = d / "pb.yaml"
    pb.write_text(PLAYBOOK)
    yield pb
    if CASES:
        print("\nkill-point cases:", *(json.dumps(c) for c in CASES), sep="\n  ")


@pytest.mark.slow
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    lines=st.integers(min_value=0, max_value=6),  # kill once this many effects were written...
    extra=st.sampled_from([0.0, 0.005, 0.02, 0.04]),  # ...and this much later (inside/after the next)
    flush_bytes=st.sampled_from([None, 1]),  # the default policy, or a flush at every append
)
def test_kill_nine_anywhere_then_resume(playbook, lines, extra, flush_bytes):
    home = Path(tempfile.mkdtemp(prefix="local-kill-home-"))
    out = home / "effects.txt"
    workload = json.dumps({"path": str(out)})
    argv = [sys.executable, "-m", "noetl_dagster.commands.main", "run", str(playbook), "--quiet", "--offline",
            "--workload", workload]  # fmt: skip
    proc = subprocess.Popen(
        argv, env=_env(home, flush_bytes), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    deadline = time.monotonic() + 60
    while proc.poll() is None and sum(_effects(out).values()) < lines and time.monotonic() < deadline:
        time.sleep(0.001)
    time.sleep(extra)
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGKILL)
    proc.wait(30)
    at_kill = _effects(out)
    eid, finished = _finished(home)
    case = {"lines": lines, "extra": extra, "flush_bytes": flush_bytes, "killed": proc.returncode == -9,
            "effects_at_kill": sum(at_kill.values()), "finished_at_kill": sorted(finished)}  # fmt: skip
    CASES.append(case)
    if sum(at_kill.values()):  # the durability rule: an effect ran, so the log before it is on disk
        assert eid is not None, case
    if eid is None:  # killed before anything ran or was written: nothing to resume, nothing happened
        return
    r = _cli(home, "resume", eid, "--json")
    assert r.returncode == 0, (case, r.stderr)
    live = json.loads(r.stdout.splitlines()[0])
    assert live["status"] == "completed" and live["results"]["end"] == 60, (case, live)
    after = _effects(out)
    for key in finished:  # never again for what the log showed finished
        assert after[key] == at_kill[key] == 1, (case, key, at_kill, after)
    assert set(after) == set(EFFECTS) and max(after.values()) <= 2, (case, after)
    # a barrier precedes every effect: only the one in flight at the kill can run twice
    assert sum(after.values()) <= len(EFFECTS) + 1, (case, after)
    replayed = json.loads(_cli(home, "replay", eid, "--json").stdout)
    assert {k: replayed[k] for k in ("status", "results", "ctx", "runs")} == {
        k: live[k] for k in ("status", "results", "ctx", "runs")
    }
    v = _cli(home, "verify", eid)
    assert v.returncode == 0 and v.stdout.startswith("OK"), v.stdout + v.stderr
    seqs = [e.sequence for e in FeatherEventStore(home / "local").read(eid)]
    assert seqs == list(range(1, len(seqs) + 1))
    case["effects_after_resume"] = sum(after.values())
