"""The worker pool over NATS (issue 45 items 2, 4): real nats-server, real worker processes.

Every test uses its own region, so its command streams (``NOETL_CMD_<region>_<shard>``) are its own
on the shared server; they are deleted at the end.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest

from noetl_dagster.dsl.loader import load_yaml_text
from noetl_dagster.dsl.parse import load_playbook_dict
from noetl_dagster.engine import events as E
from noetl_dagster.runners.local import build_services, run_playbook
from noetl_dagster.storage import nats_streams as streams
from noetl_dagster.storage.event_stores import open_event_store
from noetl_dagster.tools.command_queue import Command, NatsToolDispatch

pytestmark = pytest.mark.slow  # real worker processes (a second or two to start each)

NATS_URL = "nats://127.0.0.1:4222"
ROOT = Path(__file__).resolve().parents[2]
ENV = {
    **os.environ,
    "PYTHONPATH": os.pathsep.join(str(ROOT / p) for p in ("", "analytics", "lineage", "registry_service")),
}


@pytest.fixture
def region():
    name = f"t{uuid.uuid4().hex[:10]}"
    yield name
    with streams.connect(NATS_URL) as client:
        infos = client.call(client.js.streams_info())
        for info in infos:
            if f"_{name}_" in info.config.name:
                client.call(client.js.delete_stream(info.config.name))


class Workers:
    def __init__(self, region: str, store_url: str, tmp: Path):
        self.region, self.store_url, self.tmp = region, store_url, tmp
        self.procs: list[subprocess.Popen] = []

    def start(self, *extra: str, shard: str = "acme/p1") -> subprocess.Popen:
        log = self.tmp / f"worker{len(self.procs)}.log"
        cmd = [sys.executable, "-m", "noetl_dagster.commands.main", "worker", "--nats", NATS_URL, "--region",
               self.region, "--event-store", self.store_url, "--shard", shard, "--data-dir", str(self.tmp / "wd"), *extra]  # fmt: skip
        proc = subprocess.Popen(cmd, stderr=log.open("w"), env=ENV, cwd=self.tmp)
        proc.log = log  # type: ignore[attr-defined]
        self.procs.append(proc)
        deadline = time.time() + 60
        while "streams" not in log.read_text():
            assert proc.poll() is None, log.read_text()
            assert time.time() < deadline, "the worker did not start"
            time.sleep(0.05)
        return proc

    def stop(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.kill()
            p.wait(10)


@pytest.fixture
def workers(region, tmp_path):
    w = Workers(region, f"sqlite:///{tmp_path / 'events.db'}", tmp_path)
    yield w
    w.stop()


def playbook(text: str):
    return load_playbook_dict(load_yaml_text(text)[0])


def pool(region: str, timeout: float = 60.0) -> NatsToolDispatch:
    return NatsToolDispatch(NATS_URL, region=region, timeout=timeout)


PLAYBOOK = """
apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: pool, path: tests/pool}
workflow:
  - step: start
    tool:
      - a: {kind: python, code: "result = {'n': 2}"}
      - b: {kind: noop, result: "{{ a.n + 1 }}"}
      - flaky:
          kind: python
          code: "raise ValueError('attempt ' + str(_attempt))"
          spec:
            policy:
              rules:
                - when: "{{ outcome.status == 'error' }}"
                  then: {do: retry, attempts: 2}
                - else: {then: {do: continue}}
    next: {arcs: [{step: fan}]}
  - step: fan
    loop: {in: "{{ [1, 2, 3] }}", iterator: x, spec: {mode: parallel}}
    tool: {kind: python, input: {x: "{{ iter.x }}"}, code: "result = x * 10"}
    next: {arcs: [{step: fin}]}
  - step: fin
    tool: {kind: python, code: "result = 40 + 2"}
"""


def trace(store, execution_id: str) -> list[tuple]:
    """The execution's events as every runner must give them (ids and times left out), the pool's own
    ``command.*`` records aside."""
    out = []
    for e in store.read(execution_id):
        if e.name in E.COMMAND_EVENTS:
            continue
        d = e.data or {}
        outcome = d.get("outcome") or {}
        err = (outcome.get("error") or {}).get("message")
        out.append((e.name, e.step, e.iteration, d.get("task"), e.status, d.get("directive"),
                    json.dumps(outcome.get("result"), sort_keys=True), err))  # fmt: skip
    return out


def _by_step(rows: list[tuple]) -> dict:
    steps: dict = {}
    for row in rows:
        steps.setdefault((row[1], row[2]), []).append(row)
    return steps


def test_a_dispatched_run_records_the_in_process_trace(workers, region, tmp_path):
    workers.start("--concurrency", "2")
    here = f"sqlite:///{tmp_path / 'here.db'}"
    local = run_playbook(
        playbook(PLAYBOOK), event_store=here, data_dir=tmp_path / "a", tenant="acme", project="p1"
    )
    dispatch = pool(region)
    try:
        services = build_services(event_store=workers.store_url, data_dir=tmp_path / "b", tenant="acme",
                                  project="p1", dispatch=dispatch)  # fmt: skip
        remote = run_playbook(playbook(PLAYBOOK), services=services)
    finally:
        dispatch.close()
    assert local.to_json() | {"execution_id": None} == remote.to_json() | {"execution_id": None}
    assert remote.results["fin"] == 42 and remote.results["fan"]["results"] == [10, 20, 30]
    with open_event_store(here) as a, open_event_store(workers.store_url) as b:
        assert _by_step(trace(a, local.execution_id)) == _by_step(trace(b, remote.execution_id))
        done = [e for e in b.read(remote.execution_id) if e.name == E.COMMAND_DONE]
    # every python call ran in the pool (a, flaky twice, three iterations, fin); noop stayed here
    assert len(done) == 7 and [e.data["task"] for e in done][:3] == ["a", "flaky", "flaky"]
    assert {e.data["kind"] for e in done} == {"python"}
    assert all(e.data["reply"]["worker"].endswith(f":{workers.procs[0].pid}") for e in done)


def _effect_playbook(path: Path, sleep: float) -> str:
    return f"""
apiVersion: noetl.io/v2
kind: Playbook
metadata: {{name: effect, path: tests/effect}}
workflow:
  - step: start
    tool:
      kind: python
      code: |
        import os, time
        with open({str(path)!r}, "a") as f:
            f.write(f"start {{os.getpid()}}\\n")
        time.sleep({sleep})
        with open({str(path)!r}, "a") as f:
            f.write(f"effect {{os.getpid()}}\\n")
        result = "done"
"""


def _run_in_thread(doc: str, store_url: str, data_dir: Path, dispatch: NatsToolDispatch) -> dict:
    out: dict = {}

    def go() -> None:
        services = build_services(event_store=store_url, data_dir=data_dir, tenant="acme", project="p1",
                                  dispatch=dispatch)  # fmt: skip
        out["result"] = run_playbook(playbook(doc), services=services)

    out["thread"] = threading.Thread(target=go)
    out["thread"].start()
    return out


def _wait_for(path: Path, text: str, timeout: float = 60) -> str:
    deadline = time.time() + timeout
    while time.time() < deadline:
        body = path.read_text() if path.exists() else ""
        if text in body:
            return body
        time.sleep(0.05)
    raise AssertionError(f"{text!r} never appeared in {path}")


def test_kill_9_mid_command_redelivers_to_another_worker_and_the_effect_happens_once(
    workers, region, tmp_path
):
    first = workers.start("--ack-wait", "2")
    second = workers.start("--ack-wait", "2")
    effects = tmp_path / "effects.txt"
    dispatch = pool(region)
    try:
        run = _run_in_thread(_effect_playbook(effects, 2.0), workers.store_url, tmp_path / "d", dispatch)
        body = _wait_for(effects, "start")
        holder = int(body.split()[1])
        assert holder in (first.pid, second.pid)
        os.kill(holder, signal.SIGKILL)  # mid-command: started, its effect not yet written
        run["thread"].join(90)
        survivor = second.pid if holder == first.pid else first.pid
    finally:
        dispatch.close()
    assert run["result"].status == "completed" and run["result"].results["start"] == "done"
    lines = effects.read_text().splitlines()
    assert lines == [f"start {holder}", f"start {survivor}", f"effect {survivor}"]
    with open_event_store(workers.store_url) as store:
        events = store.read(run["result"].execution_id)
    assert [e.name for e in events].count(E.COMMAND_DONE) == 1
    assert [e.name for e in events].count(E.TASK_DONE) == 1


def test_a_redelivered_command_the_log_shows_done_is_answered_from_the_log_unrun(workers, region, tmp_path):
    """The window effect-once closes: the worker recorded command.done, then died before its ack."""
    workers.start()
    effects = tmp_path / "effects.txt"
    code = f"open({str(effects)!r}, 'a').write('effect\\n')\nresult = 7"
    command = Command(command_id=uuid.uuid4().hex, kind="python", config={"code": code}, execution_id="x-" + region,
                      tenant="acme", project="p1", step="s", task="t", attempt=1, task_run_id="tr-" + region,
                      deadline=time.time() + 60)  # fmt: skip
    dispatch = pool(region)
    try:
        with open_event_store(workers.store_url) as store:
            first = dispatch.send(command, store)
            assert first["ok"] and first["result"] == 7
            # the same command delivered again (a new message: JetStream would dedupe the same id)
            again = Command(**{**command.__dict__, "reply_to": ""})
            client = dispatch._connected()
            inbox = client.nc.new_inbox()
            replies: list = []

            async def collect(msg) -> None:
                replies.append(json.loads(msg.data))

            client.call(client.nc.subscribe(inbox, cb=collect))
            again.reply_to = inbox
            placement = streams.placement_of("acme", "p1", region=region)
            client.call(client.js.publish(placement.command_subject("acme", "p1"), again.to_bytes(),
                                          stream=placement.commands_stream, headers={"Nats-Msg-Id": "again"}))  # fmt: skip
            deadline = time.time() + 30
            while not replies and time.time() < deadline:
                time.sleep(0.05)
            events = store.read(command.execution_id)
    finally:
        dispatch.close()
    assert replies and replies[0]["ok"] and replies[0]["result"] == 7
    assert effects.read_text() == "effect\n"  # ran once
    assert [e.name for e in events] == [E.COMMAND_DONE]


def test_sigterm_drains_the_call_in_flight_then_exits(workers, region, tmp_path):
    proc = workers.start()
    effects = tmp_path / "effects.txt"
    dispatch = pool(region)
    try:
        run = _run_in_thread(_effect_playbook(effects, 1.5), workers.store_url, tmp_path / "d", dispatch)
        _wait_for(effects, "start")
        proc.send_signal(signal.SIGTERM)
        run["thread"].join(60)
        assert proc.wait(30) == 0
    finally:
        dispatch.close()
    assert run["result"].status == "completed"
    assert effects.read_text().splitlines() == [f"start {proc.pid}", f"effect {proc.pid}"]
    assert "stopped (ran 1," in proc.log.read_text()


def test_a_command_that_kills_its_workers_is_dead_lettered_after_max_deliveries(workers, region, tmp_path):
    workers.start("--ack-wait", "1", "--max-deliver", "1")
    workers.start("--ack-wait", "1", "--max-deliver", "1")
    doc = """
apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: poison, path: tests/poison}
workflow:
  - step: start
    tool: {kind: python, code: "import os\\nos._exit(9)"}
"""
    dispatch = pool(region)
    try:
        services = build_services(event_store=workers.store_url, data_dir=tmp_path / "d", tenant="acme",
                                  project="p1", dispatch=dispatch)  # fmt: skip
        result = run_playbook(playbook(doc), services=services)
        client = dispatch._connected()
        placement = streams.placement_of("acme", "p1", region=region)
        dlq = client.call(client.js.stream_info(placement.dlq_stream))
        cmd = client.call(client.js.stream_info(placement.commands_stream))
    finally:
        dispatch.close()
    assert result.status == "failed"
    with open_event_store(workers.store_url) as store:
        events = store.read(result.execution_id)
    (done,) = [e for e in events if e.name == E.TASK_DONE]
    assert done.data["outcome"]["error"]["kind"] == "dead_lettered"
    assert any(e.name == E.COMMAND_CANCELLED and "dead_lettered" in e.data["reason"] for e in events)
    assert dlq.state.messages == 1 and cmd.state.messages == 0  # moved, not left in the work queue
    deadline = time.time() + 20  # on a loaded machine the killed one may end after the dead letter
    while not any(p.poll() is not None for p in workers.procs) and time.time() < deadline:
        time.sleep(0.1)
    assert sum(p.poll() is not None for p in workers.procs) == 1  # the first delivery killed one worker


def test_a_command_past_its_deadline_is_cancelled_and_never_runs(workers, region, tmp_path):
    effects = tmp_path / "effects.txt"
    doc = _effect_playbook(effects, 0).replace("kind: python", "kind: python\n      spec: {timeout: 1}")
    dispatch = pool(region)
    try:
        services = build_services(event_store=workers.store_url, data_dir=tmp_path / "d", tenant="acme",
                                  project="p1", dispatch=dispatch)  # fmt: skip
        result = run_playbook(playbook(doc), services=services)  # no worker runs yet
        workers.start()  # now one pulls the command
        client = dispatch._connected()
        placement = streams.placement_of("acme", "p1", region=region)
        deadline = time.time() + 30
        while (
            client.call(client.js.stream_info(placement.commands_stream)).state.messages
            and time.time() < deadline
        ):
            time.sleep(0.1)
        left = client.call(client.js.stream_info(placement.commands_stream)).state.messages
    finally:
        dispatch.close()
    assert result.status == "failed" and left == 0
    with open_event_store(workers.store_url) as store:
        events = store.read(result.execution_id)
    (done,) = [e for e in events if e.name == E.TASK_DONE]
    assert done.data["outcome"]["error"]["kind"] == "timeout"
    assert any(e.name == E.COMMAND_CANCELLED for e in events)
    assert not effects.exists()


def test_the_dagster_runner_hands_tool_work_to_the_pool_with_the_same_trace(
    workers, region, tmp_path, monkeypatch
):
    import dagster as dg

    from noetl_dagster.resources.noetl import close_all_services
    from noetl_dagster.tools import command_queue
    from noetl_dagster.translator.runner import run_playbook_dagster

    proc = workers.start("--concurrency", "2")
    here = f"sqlite:///{tmp_path / 'here.db'}"
    local = run_playbook(
        playbook(PLAYBOOK), event_store=here, data_dir=tmp_path / "a", tenant="acme", project="p1"
    )
    url = f"{NATS_URL}?region={region}&kinds=python"
    monkeypatch.setenv(command_queue.DISPATCH_ENV, url)  # the setting both runners read (build_services)
    instance = dg.DagsterInstance.ephemeral()
    try:
        remote = run_playbook_dagster(playbook(PLAYBOOK), event_store=workers.store_url, data_dir=tmp_path / "b",
                                      tenant="acme", project="p1", instance=instance)  # fmt: skip
    finally:
        instance.dispose()
        close_all_services()
        command_queue.dispatch_from_env(url).close()
    assert local.to_json() | {"execution_id": None} == remote.to_json() | {"execution_id": None}
    with open_event_store(here) as a, open_event_store(workers.store_url) as b:
        assert _by_step(trace(a, local.execution_id)) == _by_step(trace(b, remote.execution_id))
        done = [e for e in b.read(remote.execution_id) if e.name == E.COMMAND_DONE]
    assert len(done) == 7 and all(e.data["reply"]["worker"].endswith(f":{proc.pid}") for e in done)


@pytest.fixture(scope="module")
def _tiers():
    made: list = []
    yield made
    for tier in made:  # after every test's replay (tests/conftest.py) has read them
        tier.cleanup()


def test_the_pool_reports_into_the_nats_event_store_of_the_execution(tmp_path, _tiers):
    """Whichever EventStore the execution uses: here the hot tier on JetStream (storage/nats_events.py),
    which the workers append command.done to and read the log of, as the engine does."""
    from nats_tier_fixtures import new_tier

    tier = new_tier(tmp_path)
    _tiers.append(tier)
    workers = Workers(tier.region, tier.url, tmp_path)
    try:
        proc = workers.start()
        here = f"sqlite:///{tmp_path / 'here.db'}"
        local = run_playbook(
            playbook(PLAYBOOK), event_store=here, data_dir=tmp_path / "a", tenant="acme", project="p1"
        )
        dispatch = pool(tier.region)
        try:
            services = build_services(event_store=tier.url, data_dir=tmp_path / "b", tenant="acme", project="p1",
                                      dispatch=dispatch)  # fmt: skip
            remote = run_playbook(playbook(PLAYBOOK), services=services)
        finally:
            dispatch.close()
        assert local.to_json() | {"execution_id": None} == remote.to_json() | {"execution_id": None}
        with open_event_store(here) as a, open_event_store(tier.url) as b:
            assert _by_step(trace(a, local.execution_id)) == _by_step(trace(b, remote.execution_id))
            done = [e for e in b.read(remote.execution_id) if e.name == E.COMMAND_DONE]
        assert len(done) == 7 and all(e.data["reply"]["worker"].endswith(f":{proc.pid}") for e in done)
    finally:
        workers.stop()


def test_a_call_longer_than_ack_wait_keeps_its_message_by_heartbeat(workers, region, tmp_path):
    workers.start("--ack-wait", "1")
    workers.start("--ack-wait", "1")  # would take the command if the heartbeat did not hold it
    effects = tmp_path / "effects.txt"
    dispatch = pool(region)
    try:
        services = build_services(event_store=workers.store_url, data_dir=tmp_path / "d", tenant="acme",
                                  project="p1", dispatch=dispatch)  # fmt: skip
        result = run_playbook(playbook(_effect_playbook(effects, 3.5)), services=services)
    finally:
        dispatch.close()
    assert result.status == "completed"
    assert len(effects.read_text().splitlines()) == 2  # one start, one effect: never redelivered


def test_worker_processes_start_together_and_drain_on_sigterm(region, tmp_path):
    log = tmp_path / "pool.log"
    cmd = [sys.executable, "-m", "noetl_dagster.commands.main", "worker", "--nats", NATS_URL, "--region", region,
           "--shard", "acme/p1", "--processes", "2", "--event-store", f"sqlite:///{tmp_path / 'e.db'}"]  # fmt: skip
    proc = subprocess.Popen(cmd, stderr=log.open("w"), env=ENV, cwd=tmp_path)
    try:
        deadline = time.time() + 60
        while log.read_text().count("streams") < 2:
            assert proc.poll() is None and time.time() < deadline, log.read_text()
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    assert log.read_text().count("stopped (ran 0,") == 2


def test_a_plumbing_failure_naks_the_command_with_a_delay_and_it_is_delivered_again(region, tmp_path):
    """The worker's own failure (here its event store refuses the first command.done) is not the task's
    outcome: the command goes back to the queue after a delay and the next delivery answers it."""
    from noetl_dagster.runners.pool_worker import PoolWorker, nak_delay

    assert [nak_delay(n) for n in (1, 2, 3, 6, 20)] == [1.0, 2.0, 4.0, 30.0, 30.0]
    store = open_event_store(f"sqlite:///{tmp_path / 'e.db'}")
    refused: list[float] = []
    append = store.append

    def flaky_append(events):
        if not refused:
            refused.append(time.monotonic())
            raise OSError("disk full")
        return append(events)

    store.append = flaky_append
    worker = PoolWorker(NATS_URL, store, region=region, shards=[streams.shard_of("acme", "p1")], ack_wait=30)
    thread = threading.Thread(target=worker.run)
    thread.start()
    dispatch = pool(region)
    try:
        command = Command(command_id=uuid.uuid4().hex, kind="python", config={"code": "result = 5"},
                          execution_id="x-" + region, tenant="acme", project="p1", step="s", task="t", attempt=1,
                          deadline=time.time() + 60)  # fmt: skip
        reply = dispatch.send(command, store)
        answered = time.monotonic()
    finally:
        dispatch.close()
        worker.stop.set()
        thread.join(30)
    assert reply["ok"] and reply["result"] == 5
    assert worker.counts["nak"] == 1 and worker.counts["ran"] == 1
    assert answered - refused[0] >= 0.9  # NAKed with delay 1 s (first delivery), not redelivered at once


def test_a_message_that_is_not_a_command_is_dead_lettered(workers, region):
    workers.start()
    placement = streams.placement_of("acme", "p1", region=region)
    with streams.connect(NATS_URL) as client:
        client.ensure_streams(placement)
        client.call(client.js.publish(placement.command_subject("acme", "p1"), b"{not json",
                                      stream=placement.commands_stream))  # fmt: skip
        deadline = time.time() + 30
        while client.call(client.js.stream_info(placement.dlq_stream)).state.messages < 1:
            assert time.time() < deadline, "never dead-lettered"
            time.sleep(0.1)
        msg = client.call(client.js.get_msg(placement.dlq_stream, 1))
        left = client.call(client.js.stream_info(placement.commands_stream)).state.messages
    record = json.loads(msg.data)
    assert record["data"] == "{not json" and record["reason"].startswith("not a command")
    assert left == 0
