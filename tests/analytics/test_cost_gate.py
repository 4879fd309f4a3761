"""Money at one gate (DESIGN.md "Guarantees at one gate"): one priced table every view reads, writes
idempotent by event id, one billing rule for stored references (engine/usage_lines.BilledRefs).

A Hypothesis property over generated executions that use every construct producing usage lines:
task attempts with CPU (measured, ``cpu_ms``, duration x units), RAM, GPU (seconds, count, class),
Kubernetes requests, egress (meta, usage, HTTP request bytes), calls by kind and quantum shots and
QPU seconds; retries and failed attempts, failed steps, cycles (a step run again), loops with failed
iterations and loop.done's list of results, sub-playbooks (their own executions, their reference
handed to the parent with its producer), stored references produced here (task.done, step.done,
an iteration, loop.done), passed on, from another execution, and producer-less (a user-chosen
uri several executions name, as a ``$ref`` or a ``noetl://`` descriptor), the platform line of
workflow.finished; two tenants, two price versions, executions crossing midnight. The log is
appended in random chunks (the execution summary folded as it goes) and exported into real chDB in
random batch splits, then re-exported from a random cursor. Every view agrees to 1e-8 USD: the
priced table (per execution and in total), ``cost_of_events`` (per execution and over the whole
log), the explain fold (the stored summary the page reads), the ops' cost metadata (each op's
window of the log priced as Dagster's ops price it, plus the platform line), the static
dashboard's Totals tile and the FOCUS export; a re-export and a full refresh change no total."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta

import pytest
import yaml
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from noetl_analytics.dashboard_access import TenantScope, Viewer
from noetl_analytics.execution_view import ExecutionViews
from noetl_analytics.exporter import FactExporter
from noetl_analytics.focus import focus_table
from noetl_analytics.panels import panel
from noetl_analytics.pricing import Cost, PriceTable, cost_of_events
from noetl_analytics.rollups import refresh_rollups
from noetl_analytics.store import FactsStore, close_all
from noetl_dagster.engine.events import Event
from noetl_dagster.engine.usage_lines import created_refs
from noetl_dagster.storage.events import SqliteEventStore
from noetl_dagster.translator.ops import _events_of_runs, window_cost

USD = 1e-8  # a millionth of a cent
# a tenth of the profile's examples: 10 here, 5 under the CI profile (tests/conftest.py); each one
# runs ~60 chDB statements (export, re-export, refresh, views)
EXAMPLES = max(3, settings().max_examples // 10)
PRICES = {
    "currency": "USD",
    "worker_class_by_kind": {"duckdb": "cpu.large"},
    "versions": [
        {
            "version": "v1",
            "valid_from": "2026-01-01",
            "compute": {"default": 36.0, "cpu.large": 72.0, "gpu.small": 50.0},
            "ram": 3.6,
            "gpu": {"default": 2.48, "a100": 4.1},
            "egress": {"default": 0.09, "eu-west": 0.12},
            "storage": {"default": 0.023, "s3": 0.025},
            "storage_months": 3,
            "call": {"python": 0.0001, "http": 0.0002, "playbook": 0.0003},
            "quantum": {"shot": 0.0009, "qpu_second": 1.6},
            "platform": 18.0,
        },
        {  # the day after T0: a line's day picks its price
            "version": "v2",
            "valid_from": "2026-03-03",
            "compute": {"default": 40.0, "cpu.large": 80.0},
            "ram": 4.0,
            "gpu": 3.0,
            "egress": 0.1,
            "storage": {"default": 0.03},
            "storage_months": 2,
            "call": {"default": 0.0005},
            "quantum": {"shot": 0.001, "qpu_second": 2.0},
            "platform": 20.0,
        },
    ],
}
T0 = datetime(2026, 3, 2, 23, 59, 30, tzinfo=UTC)
USER_URIS = ("s3://shared/reports/daily.json", "noetl://acme/p/dataset/daily")  # no producer in them
EXAMPLE = itertools.count()  # execution ids are new in each example: only the priced lines are emptied


class _World:
    """Generated executions: each a list of events in its order (timestamps come with the global order)."""

    def __init__(self, draw):  # noqa: ANN001
        self.draw = draw
        self.streams: list[list[Event]] = []
        self.own: dict[str, list[dict]] = {}  # execution -> the references it produced
        self.n = 0

    def pick(self, strategy):  # noqa: ANN001, ANN202
        return self.draw(strategy)

    def chance(self) -> bool:
        return self.pick(st.booleans())

    def size(self) -> int:
        return self.pick(st.integers(1, 9)) * 10**8  # 0.1-0.9 GB: storage lines of cents

    def ref(self, eid: str) -> dict:
        """A stored reference for a result: a new one of this execution, one it named before, one
        another execution produced (with its producer), or a producer-less user uri."""
        kind = self.pick(st.sampled_from(["new", "again", "foreign", "user", "descriptor", "user"]))
        mine = self.own.setdefault(eid, [])
        others = [r for e, refs in self.own.items() if e != eid for r in refs]
        if kind == "again" and mine:
            return {"$ref": self.pick(st.sampled_from(mine))}
        if kind == "foreign" and others:
            return {"$ref": self.pick(st.sampled_from(others))}
        if kind in ("user", "descriptor"):
            uri = self.pick(st.sampled_from(USER_URIS))
            body = {"uri": uri, "store": self.pick(st.sampled_from(["s3", "file"])), "format": "json",
                    "size": self.size(), "checksum": "sha256:00"}  # fmt: skip
            return body if kind == "descriptor" and uri.startswith("noetl://") else {"$ref": body}
        ref = {"uri": f"s3://b/{eid}/r{len(mine)}.json", "store": self.pick(st.sampled_from(["s3", "fs"])),
               "format": "json", "size": self.size(), "checksum": f"c{len(mine)}", "execution_id": eid}  # fmt: skip
        mine.append(ref)
        return {"$ref": ref}

    def result(self, eid: str) -> dict:
        return self.ref(eid) if self.chance() else {"ok": self.pick(st.integers(0, 3))}

    def meta(self, kind: str) -> tuple[dict, dict]:
        """(outcome.meta, extra outcome keys) of one attempt: the usage every line reads."""
        pick, chance = self.pick, self.chance
        meta: dict = {"duration_ms": pick(st.integers(1, 120)) * 500.0}
        usage: dict = {}
        outcome: dict = {}
        cpu = pick(st.sampled_from(["measured", "cpu_ms", "units", "runtime"]))
        if cpu == "measured":
            usage["cpu_s"] = pick(st.integers(0, 40)) / 10
            if chance():
                usage["child_cpu_s"] = pick(st.integers(0, 20)) / 10
        elif cpu == "cpu_ms":
            meta["cpu_ms"] = pick(st.integers(0, 9000)) * 1.0
        elif cpu == "units":
            meta["units"] = pick(st.integers(1, 4))
        if chance():
            usage["mem_delta_bytes"] = pick(st.integers(-(10**8), 3 * 10**9))
        gpu = pick(st.sampled_from(["none", "seconds", "count", "meta"]))
        if gpu == "seconds":
            usage["gpu_s"] = pick(st.integers(1, 600)) * 1.0
        elif gpu == "count":
            usage["gpus"] = pick(st.integers(1, 2))
        elif gpu == "meta":
            meta["gpus"] = 1
        if gpu != "none" and chance():
            usage["gpu_class"] = pick(st.sampled_from(["a100", "t4"]))
        if chance():
            meta["requests"] = {"cpu": pick(st.sampled_from([0.5, 2.0])), "memory_bytes": 2**30,
                                **({"gpu": 1.0} if chance() else {})}  # fmt: skip
        if chance():
            meta["worker_class"] = pick(st.sampled_from(["gpu.small", "cpu.large"]))
        egress = pick(st.sampled_from(["none", "meta", "usage", "http"]))
        gb = pick(st.integers(1, 30)) * 10**8
        if egress == "meta":
            meta["egress_bytes"] = gb
        elif egress == "usage":
            usage["egress_bytes"] = gb
        elif egress == "http":
            outcome["http"] = {"request_bytes": gb, "status": 200}
        if egress != "none" and chance():
            meta["region"] = "eu-west"
        if kind == "quantum" or chance():
            usage["shots"] = pick(st.integers(0, 4000))
            usage["qpu_s"] = pick(st.integers(0, 30)) / 10
        if usage:
            meta["usage"] = usage
        return meta, outcome

    def ev(self, out: list[Event], name: str, eid: str, tenant: str, data: dict | None = None, **kw) -> None:  # noqa: ANN003
        out.append(Event(name, eid, data or {}, tenant_id=tenant, project_id="p", **kw))

    def attempts(self, out: list[Event], eid: str, tenant: str, step: str, run: str, result: dict,
                 **kw) -> bool:  # fmt: skip  # noqa: ANN003
        """One task's attempts (retries: failed ones first); whether the last one succeeded."""
        kind = self.pick(st.sampled_from(["python", "http", "duckdb", "quantum", "shell"]))
        n = self.pick(st.integers(1, 3))
        ok = self.chance() or self.chance()
        for a in range(1, n + 1):
            meta, extra = self.meta(kind)
            meta["attempt"] = a
            last = a == n
            status = "ok" if last and ok else "error"
            outcome = {"status": status, "meta": meta, **extra}
            if status == "ok":
                outcome["result"] = result
            else:
                outcome["error"] = {"kind": "boom", "message": "failed", "retryable": not last}
            self.ev(out, "task.started", eid, tenant, {"task": "t", "kind": kind}, step=step, step_run_id=run,
                    attempt=a, **kw)  # fmt: skip
            self.ev(out, "task.done", eid, tenant, {"task": "t", "kind": kind, "outcome": outcome,
                    "directive": "continue" if last else "retry"}, step=step, step_run_id=run, attempt=a, **kw)  # fmt: skip
        return ok

    def execution(self, eid: str, tenant: str, parent: str | None = None) -> None:
        out: list[Event] = []
        self.streams.append(out)
        kw = {"parent_execution_id": parent} if parent else {}
        self.ev(out, "playbook.execution.requested", eid, tenant, {"playbook": f"tests/gate/{eid}"}, **kw)
        self.ev(out, "workflow.started", eid, tenant, {"entry": "a"}, **kw)
        for k in range(self.pick(st.integers(1, 7 if parent is None else 3))):
            shapes = ["task", "loop", "sub", "relay"] if parent is None else ["task", "loop"]
            shape = self.pick(st.sampled_from(shapes))
            step = self.pick(st.sampled_from(["a", "b", "c"]))  # the same step again: a cycle
            run = f"{eid}-{step}-{k}"
            at = {"step": step, "step_run_id": run, **kw}
            self.ev(out, "step.scheduled", eid, tenant, {"args": {}}, **at)
            self.ev(out, "step.started", eid, tenant, **at)
            if shape == "loop":
                loop = f"{run}-loop"
                total = self.pick(st.integers(0, 4))
                self.ev(
                    out, "loop.started", eid, tenant, {"total": total, "mode": "parallel"}, loop_id=loop, **at
                )
                results = []
                for i in range(total):
                    where = {"loop_id": loop, "iteration": i, **at}
                    self.ev(out, "loop.iteration.started", eid, tenant, **where)
                    result = self.result(eid)
                    if self.attempts(out, eid, tenant, step, run, result, loop_id=loop, iteration=i, **kw):
                        results.append(result)
                        self.ev(out, "loop.iteration.done", eid, tenant, {"result": result}, **where)
                    else:
                        self.ev(
                            out, "loop.iteration.failed", eid, tenant, {"error": {"kind": "boom"}}, **where
                        )
                if self.chance():
                    results.append(self.ref(eid))  # a reference only loop.done's list names
                self.ev(out, "loop.done", eid, tenant, {"result": {"results": results, "stats": {"total": total}},
                        "duration_ms": 10}, loop_id=loop, **at)  # fmt: skip
                self.ev(out, "step.done", eid, tenant, {"result": {"status": "ok"}}, **at)
            elif shape == "sub":
                child = f"{eid}-sub{k}"
                self.execution(child, tenant, parent=eid)
                handed = self.pick(st.sampled_from(self.own.get(child) or [None]))
                result = (
                    {"$ref": handed} if handed else {"ok": 1}
                )  # the child's reference, its producer in it
                meta, _ = self.meta("playbook")
                outcome = {"status": "ok", "result": result, "meta": {**meta, "attempt": 1}}
                self.ev(
                    out,
                    "task.done",
                    eid,
                    tenant,
                    {"task": "sub", "kind": "playbook", "outcome": outcome},
                    attempt=1,
                    **at,
                )
                self.ev(out, "step.done", eid, tenant, {"result": result}, **at)
            else:
                # relay: the execution's first reference passed on, steps later (an op whose window
                # of the log does not reach back to where it was billed)
                mine = self.own.get(eid)
                result = {"$ref": mine[0]} if shape == "relay" and mine else self.result(eid)
                if self.attempts(out, eid, tenant, step, run, result, **kw):
                    done = result if self.chance() else self.ref(eid)  # its task's result, or another
                    self.ev(out, "step.done", eid, tenant, {"result": done, "duration_ms": 5}, **at)
                else:
                    self.ev(out, "step.failed", eid, tenant, {"error": {"kind": "boom"}}, **at)
            self.ev(out, "next.evaluated", eid, tenant, {"fired": []}, **at)
        finished = {"status": "completed"}
        if self.chance():
            finished["platform"] = {"cpu_s": self.pick(st.integers(1, 90)) / 10, "window": "execution"}
        self.ev(out, "workflow.finished", eid, tenant, finished, **kw)

    def log(self) -> list[Event]:
        """The executions' events interleaved in a drawn global order (each keeps its own), with
        timestamps rising along it (past midnight: two days, two price versions)."""
        queues = [list(s) for s in self.streams]
        out: list[Event] = []
        while any(queues):
            live = [q for q in queues if q]
            q = live[self.pick(st.integers(0, len(live) - 1))] if len(live) > 1 else live[0]
            out.append(q.pop(0))
        for i, e in enumerate(out):
            e.timestamp = (T0 + timedelta(milliseconds=250 * i)).isoformat(timespec="microseconds")
        return out


@st.composite
def worlds(draw) -> list[Event]:  # noqa: ANN001
    w, n = _World(draw), next(EXAMPLE)
    for i in range(draw(st.integers(2, 3))):  # two at least: the rule is about executions apart
        w.execution(f"g{n}x{i}", draw(st.sampled_from(["acme", "globex"])))
    return w.log()


@pytest.fixture(scope="module")
def gate(tmp_path_factory):
    """One chDB database for every example (its migrations take seconds), emptied before each."""
    home = tmp_path_factory.mktemp("gate")
    (home / "prices.yaml").write_text(yaml.safe_dump(PRICES))
    store = FactsStore(f"chdb://{home / 'facts'}", database="cost_gate")
    yield home, store
    close_all()


def _priced(store: FactsStore) -> tuple[float, dict[str, float]]:
    _, rows = store.query("SELECT playbook, sum(amount) FROM $db.cost_line_day FINAL GROUP BY playbook")
    by = {pb.removeprefix("tests/gate/"): float(a) for pb, a in rows}
    return sum(by.values()), by


def _ops_total(
    prices: PriceTable, log: SqliteEventStore, eid: str, events: list[Event], merged: list[bool]
) -> float:
    """The sum of the ops' cost metadata of one execution: each step run an op of its own, or joined
    to the one before (``merged``: a region op running several), each op priced over its window of
    the log (the tail from its last event, widened until it holds its runs) as Dagster's op prices it."""
    runs = list(dict.fromkeys(e.step_run_id for e in events if e.step_run_id))
    last_of = {e.step_run_id: e.sequence for e in events if e.step_run_id}
    ops: list[set[str]] = []
    for i, run in enumerate(runs):
        if ops and i < len(merged) and merged[i]:
            ops[-1].add(run)
        else:
            ops.append({run})
    total = 0.0
    for op in ops:
        last = max(last_of[r] for r in op)
        total += sum(window_cost(prices, log, eid, last, op).values(), Cost()).total
        start = _events_of_runs(log, eid, last, op)[0].sequence
        named = {r["uri"] for e in events if e.step_run_id in op for r in created_refs(e.name, e.data)}
        if named & {r["uri"] for e in events if e.sequence < start for r in created_refs(e.name, e.data)}:
            event("an op names a reference named before its window")
    return total


def _label(events: list[Event]) -> None:
    """What the example holds (pytest --hypothesis-show-statistics)."""
    named: dict[str, set[str]] = {}
    for e in events:
        for r in created_refs(e.name, e.data):
            producer = r.get("execution_id")
            if not producer:
                named.setdefault(r["uri"], set()).add(e.execution_id)
            elif producer != e.execution_id:
                event("a reference named by an execution that did not produce it")
    if any(len(v) > 1 for v in named.values()):
        event("a producer-less uri named by two executions")
    if any(e.parent_execution_id for e in events):
        event("a sub-playbook")


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow,
          HealthCheck.data_too_large, HealthCheck.function_scoped_fixture])  # fmt: skip
@given(events=worlds(), data=st.data())
def test_every_view_bills_the_same(gate, tmp_path_factory, events, data):
    home, store = gate
    _label(events)
    for table in ("usage_fact", "cost_line_day"):  # what the views sum (the other facts are per execution)
        store.command(f"TRUNCATE TABLE $db.{table}")
    prices = PriceTable.load(data_dir=home)
    eids = list(dict.fromkeys(e.execution_id for e in events))
    log = SqliteEventStore(tmp_path_factory.mktemp("log") / "events.db")
    try:
        i = 0
        while i < len(events):  # appended in chunks: the summary is folded and written as it goes
            n = data.draw(st.integers(1, 40), label="append chunk")
            log.append(events[i : i + n])
            i += n
        stored = {eid: log.read(eid) for eid in eids}
        python = {eid: sum(cost_of_events(prices, evs).values(), Cost()) for eid, evs in stored.items()}
        views = ExecutionViews(log, data_dir=str(home))
        page = {eid: views.explain(eid)["totals"]["cost"] for eid in eids}
        merged = data.draw(st.lists(st.integers(0, 3).map(lambda k: k == 0), max_size=12), label="region ops")
        ops = {eid: _ops_total(prices, log, eid, stored[eid], merged) + python[eid].platform for eid in eids}

        # 1-3 batches, cut anywhere, in one or two export calls (a batch costs a dozen statements)
        batches = data.draw(st.integers(1, 3), label="batches")
        exporter = FactExporter(store, log, batch_events=-(-len(events) // batches), prices=prices)
        exporter.export(max_events=data.draw(st.integers(1, len(events)), label="first export call"))
        exporter.export()
        facts, by_execution = _priced(store)
        tile = TenantScope(store, Viewer.everyone()).query(panel("summary").render_sql(store.database))
        tile_cost = tile[1][0][tile[0].index("cost")]
        focus = sum(focus_table(store, viewer=Viewer.everyone()).column("BilledCost").to_pylist())

        last = log.tail_last()
        exporter.save_cursor(data.draw(st.integers(0, last), label="re-export from"))
        exporter.export()
        again, again_by = _priced(store)
        refresh_rollups(store, prices)
        refreshed, _ = _priced(store)
    finally:
        log.close()

    py_total = sum(c.total for c in python.values())
    whole = sum(cost_of_events(prices, events).values(), Cost()).total  # several executions in one call
    assert py_total > 0
    for eid in eids:
        assert by_execution.get(eid, 0.0) == pytest.approx(python[eid].total, abs=USD), ("facts", eid)
        assert page[eid] == pytest.approx(python[eid].total, abs=USD), ("explain", eid)
        assert ops[eid] == pytest.approx(python[eid].total, abs=USD), ("ops", eid)
    for name, value in {"facts": facts, "cost_of_events(whole log)": whole, "Totals tile": tile_cost,
                        "FOCUS": focus, "re-exported": again, "refreshed": refreshed}.items():  # fmt: skip
        assert value == pytest.approx(py_total, abs=USD), name
    assert again_by == pytest.approx(by_execution, abs=1e-12)
