"""A stored reference is billed once per execution in every cost view (one rule: engine/usage_lines.BilledRefs).

The execution summary (``noetl-dagster explain``, the execution page, table ``noetl_explain``) billed a
reference once per step run (per iteration in a loop), the facts and Dagster's cost metadata once per
execution: a step run again in a cycle re-emitting a reference, loop iterations returning the same one
or a later step passing one on cost more on the page than in the priced table. Generated executions use
every event that can name a reference (task.done, step.done, loop.iteration.done, loop.done's list of
results, with one it alone names), cycles, loops, retries and pass-through; the summary is written in
small steps and restored from its rows between appends (its billed references in chunks), and the facts
are exported in small batches, then again from the start (a re-export must not double)."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta

import pytest
import yaml

from noetl_analytics.execution_view import ExecutionViews, pricer
from noetl_analytics.exporter import FactExporter
from noetl_analytics.pricing import Cost, PriceTable, cost_of_events
from noetl_analytics.rollups import refresh_rollups
from noetl_analytics.store import FactsStore, close_all
from noetl_dagster.engine import explain_summary
from noetl_dagster.engine.events import Event
from noetl_dagster.engine.explain import explain
from noetl_dagster.engine.usage_lines import BilledRefs, created_refs
from noetl_dagster.storage.events import SqliteEventStore

PRICES = {
    "currency": "USD",
    "versions": [
        {
            "version": "p-1",
            "valid_from": "2026-01-01",
            "compute": 36.0,
            "ram": 3.6,
            "egress": 0.09,
            "storage": {"default": 0.023, "s3": 0.025},
            "storage_months": 3,
            "call": {"python": 0.0001, "default": 0.0002},
            "platform": 18.0,
        }
    ],
}
T0 = datetime(2026, 3, 2, 23, 59, 59, tzinfo=UTC)  # the executions cross midnight: lines of two days


class _Gen:
    """One generated execution's events (recorded, as the engine writes them)."""

    def __init__(self, rng: random.Random, eid: str):
        self.rng, self.eid, self.events, self.pool, self.n = rng, eid, [], [], 0

    def ev(self, name: str, data: dict | None = None, **kw) -> None:  # noqa: ANN003
        self.n += 1
        ts = (T0 + timedelta(milliseconds=137 * self.n)).isoformat(timespec="microseconds")
        self.events.append(
            Event(name, self.eid, data or {}, tenant_id="acme", project_id="p", timestamp=ts, **kw)
        )

    def ref(self) -> dict:
        """A stored reference: a new one, or one named before (a step passing it on, a cycle re-emitting it)."""
        if self.pool and self.rng.random() < 0.6:
            return self.rng.choice(self.pool)
        r = {"$ref": {"uri": f"s3://b/{self.eid}/r{len(self.pool)}.json", "store": self.rng.choice(["s3", "fs"]),
                      "format": "json", "size": self.rng.randint(1, 9) * 10**9, "checksum": f"c{len(self.pool)}"}}  # fmt: skip
        self.pool.append(r)
        return r

    def result(self) -> dict:
        return self.ref() if self.rng.random() < 0.7 else {"ok": self.rng.randint(0, 3)}

    def task(self, step: str, run: str, result: dict, **kw) -> None:  # noqa: ANN003
        meta = {"attempt": 1, "duration_ms": self.rng.randint(1, 90) * 1000.0,
                "usage": {"cpu_s": self.rng.randint(1, 50) / 10}}  # fmt: skip
        self.ev("task.started", step=step, step_run_id=run, **kw)
        self.ev("task.done", {"task": "t", "kind": "python", "outcome": {"status": "ok", "result": result, "meta": meta}},
                step=step, step_run_id=run, **kw)  # fmt: skip

    def build(self) -> list[Event]:
        rng = self.rng
        self.ev("playbook.execution.requested", {"playbook": "tests/billed_once"})
        self.ev("workflow.started", {"entry": "make"})
        for k in range(rng.randint(3, 9)):
            step = rng.choice(["make", "pass", "fan"])  # the same step again: a cycle
            run = f"{self.eid}-{step}-{k}"
            self.ev("step.scheduled", {"args": {}}, step=step, step_run_id=run)
            self.ev("step.started", step=step, step_run_id=run)
            if step == "fan":
                total = rng.randint(1, 5)
                loop = f"{run}-loop"
                self.ev(
                    "loop.started",
                    {"total": total, "mode": "parallel"},
                    step=step,
                    step_run_id=run,
                    loop_id=loop,
                )
                results = []
                for i in range(total):
                    where = {"loop_id": loop, "iteration": i}
                    self.ev("loop.iteration.started", step=step, step_run_id=run, **where)
                    results.append(self.result())
                    for _ in range(rng.randint(1, 2)):  # a retry names the same result again
                        self.task(step, run, results[-1], **where)
                    self.ev(
                        "loop.iteration.done", {"result": results[-1]}, step=step, step_run_id=run, **where
                    )
                if rng.random() < 0.5:
                    results.append(self.ref())  # a reference only loop.done's list names (first or not)
                self.ev("loop.done", {"result": {"results": results, "stats": {"total": total}}}, step=step,
                        step_run_id=run, loop_id=loop)  # fmt: skip
                self.ev("step.done", {"result": {"status": "ok"}}, step=step, step_run_id=run)
            else:
                result = self.result()
                self.task(step, run, result)
                done = result if rng.random() < 0.8 else self.ref()  # its task's result, or another
                self.ev("step.done", {"result": done}, step=step, step_run_id=run)
            self.ev("next.evaluated", {"fired": []}, step=step, step_run_id=run)
        self.ev(
            "workflow.finished", {"status": "completed", "platform": {"cpu_s": 0.5, "window": "execution"}}
        )
        return self.events


def _generated(seed: int) -> list[Event]:
    return _Gen(random.Random(seed), f"exec-billed-{seed}").build()


def _per_step_rule(events: list[Event]) -> int:
    """How many storage lines the old summary rule (once per step run, per iteration in a loop) billed
    beyond once per execution: a generated execution where the two rules differ has some."""
    per_run: set[tuple] = set()
    execution: set[str] = set()
    for e in events:
        if e.name in ("task.done", "step.done", "loop.iteration.done"):
            for r in created_refs(e.name, e.data):
                per_run.add((e.step_run_id, e.iteration, r["uri"]))
                execution.add(r["uri"])
    return len(per_run) - len(execution)


@pytest.fixture
def home(tmp_path):
    d = tmp_path / "home"
    d.mkdir()
    (d / "prices.yaml").write_text(yaml.safe_dump(PRICES))
    return d


def _python(home, events):  # noqa: ANN001, ANN202
    return cost_of_events(PriceTable.load(data_dir=home), events)


@pytest.mark.parametrize("seed", range(40))
def test_summary_fold_bills_a_reference_once_per_execution(home, seed):
    events = _generated(seed)
    price, _ = pricer(data_dir=str(home))
    data = explain(events, price=price).data
    python = _python(home, events)
    assert data["totals"]["cost"] == pytest.approx(sum(python.values(), Cost()).total, abs=1e-9)
    by_step = {s["step"]: s["cost"] for s in data["steps"]}
    for step, cost in python.items():
        if step:  # "" is the execution's platform line
            assert by_step[step] == pytest.approx(cost.total, abs=1e-9), step
    assert data["totals"]["platform_cost"] == pytest.approx(python[""].total, abs=1e-9)


def test_generated_executions_bill_references_again(home):
    """The generator makes the case: most executions name a reference again where the old rule billed it."""
    assert sum(_per_step_rule(_generated(seed)) > 0 for seed in range(40)) >= 20


@pytest.mark.parametrize("seed", [3, 11])
def test_page_facts_and_python_pricing_agree_and_a_re_export_does_not_double(
    home, tmp_path, monkeypatch, seed
):
    # the summary written every few events, its billed references in chunks of 2, restored between appends
    monkeypatch.setattr(explain_summary, "WRITE_EVERY", 3)
    monkeypatch.setattr(BilledRefs, "CHUNK", 2)
    events = _generated(seed) + _generated(seed + 100)
    assert _per_step_rule(events) > 0
    db = tmp_path / "events.db"
    rng = random.Random(seed)
    i = 0
    while i < len(events):
        n = rng.randint(1, 7)
        log = SqliteEventStore(db)  # a new store: the summary is restored from its rows
        try:
            log.append(events[i : i + n])
        finally:
            log.close()
        i += n
    log = SqliteEventStore(db)
    try:
        chunks = {eid: [o for o, _ in log.summary(eid)[1] if o >= explain_summary.BILLED] for eid in
                  {e.execution_id for e in events}}  # fmt: skip
        assert all(len(c) > 1 for c in chunks.values()), chunks
        views = ExecutionViews(log, data_dir=str(home))
        page = {eid: views.explain(eid)["totals"]["cost"] for eid in chunks}
        # from the summary the appends wrote: no event read but each playbook.execution.requested
        assert views.rebuilt == 0 and views.reads == len(page)
        store = FactsStore(f"chdb://{tmp_path / 'facts'}")
        prices = PriceTable.load(data_dir=home)
        exporter = FactExporter(store, log, batch_events=5, prices=prices)
        exporter.export()
        refresh_rollups(store, prices)
        facts = dict(store.query("SELECT execution_id, 0 FROM $db.usage_fact FINAL GROUP BY execution_id")[1])
        total = store.scalar("SELECT sum(amount) FROM $db.cost_line_day FINAL")
        exporter.save_cursor(0)  # a lost cursor: every event exported again
        exporter.export()
        refresh_rollups(store, prices)
        again = store.scalar("SELECT sum(amount) FROM $db.cost_line_day FINAL")
        _, step_rows = store.query("SELECT step, sum(amount) FROM $db.cost_line_day FINAL GROUP BY step")
    finally:
        log.close()
        close_all()
    python = _python(home, events)
    assert set(facts) == set(page)
    py_total = sum(python.values(), Cost()).total
    assert sum(page.values()) == pytest.approx(py_total, abs=1e-9)
    assert total == pytest.approx(py_total, abs=1e-9)
    assert again == pytest.approx(total, abs=1e-12)
    for step, amount in step_rows:
        assert amount == pytest.approx(python[step].total, abs=1e-9), step


def test_a_summary_written_before_the_rule_is_folded_anew_once(home, tmp_path, monkeypatch):
    """A summary without its billed references (written before them) is not trusted: the page folds
    the log once and writes the summary back, and the next reader uses it."""
    from noetl_dagster.util.jsonutil import dumps, loads  # noqa: PLC0415

    monkeypatch.setattr(explain_summary, "WRITE_EVERY", 3)  # a summary for this short execution too
    events = _generated(5)
    eid = events[0].execution_id
    log = SqliteEventStore(tmp_path / "events.db")
    try:
        log.append(events)
        last, rows = log.summary(eid)
        head = loads(rows[0][1])
        del head["billed"]
        old = [(0, dumps(head))] + [(n, b) for n, b in rows[1:] if n < explain_summary.BILLED]
        assert log.put_summary(eid, last, last, old)
        warm = ExecutionViews(log, data_dir=str(home))
        assert warm.warm() == 1 and warm.rebuilt == 1  # `serve --warm` writes it back too
        assert ExecutionViews(log, data_dir=str(home)).warm() == 0
        assert log.put_summary(eid, last, last, old)
        first = ExecutionViews(log, data_dir=str(home))
        cost = first.explain(eid)["totals"]["cost"]
        second = ExecutionViews(log, data_dir=str(home))
        assert second.explain(eid)["totals"]["cost"] == cost
        assert (first.rebuilt, second.rebuilt) == (1, 0)
    finally:
        log.close()
    assert cost == pytest.approx(sum(_python(home, events).values(), Cost()).total, abs=1e-9)
