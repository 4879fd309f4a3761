"""Events -> fact rows -> Arrow batches -> ClickHouse.

:class:`FactBuilder` turns NoETL events into row tuples, one list per fact
table, with a dispatch on the event name (an event that implies no fact costs
one dict lookup). Values go into the tuples as the event holds them; Arrow
converts whole columns at once, and a column that does not convert (a number
sent as text, a directive sent as a mapping) is coerced value by value, so a
malformed event never stops an export. Missing values travel as nulls, which
ClickHouse stores as the column default. :class:`FactWriter` inserts the
Arrow tables with ``insert_arrow``. Rows keep the source ``event_id`` in their
sorting key, so a re-sent event collapses into its first copy
(``sql/V001__facts.sql``).
"""

from __future__ import annotations

import gc
import json
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from itertools import islice
from typing import Any

import pyarrow as pa

from noetl_analytics.pricing import BilledRefs, usage_lines
from noetl_analytics.store import FactsStore
from noetl_dagster.engine import events as ev
from noetl_dagster.engine.usage_lines import foreign_refs

_TS = pa.timestamp("us", tz="UTC")
_STR = pa.string()
_F64 = pa.float64()
_U64 = pa.uint64()
_I64 = pa.int64()
_U32 = pa.uint32()
_U16 = pa.uint16()
_U8 = pa.uint8()

# Column order and Arrow type of every fact table the writer inserts into (must match
# sql/V001__facts.sql). compute_fact is filled by ClickHouse from task_fact (a materialized
# view), so each task attempt crosses the Python/Arrow boundary once.
COMMON = [("event_id", _STR), ("ts", _TS), ("tenant_id", _STR), ("project_id", _STR), ("execution_id", _STR)]
SCHEMAS: dict[str, list[tuple[str, pa.DataType]]] = {
    "execution_fact": COMMON
    + [
        ("parent_execution_id", _STR),
        ("playbook", _STR),
        ("playbook_name", _STR),
        ("transition", _STR),
        ("status", _STR),
        ("duration_ms", _F64),
        ("region", _STR),
        ("shard", _STR),
    ],
    "step_fact": COMMON
    + [
        ("step", _STR),
        ("step_run_id", _STR),
        ("outcome", _STR),
        ("duration_ms", _F64),
        ("error_kind", _STR),
        ("error_message", _STR),
    ],
    "task_fact": COMMON
    + [
        ("step", _STR),
        ("step_run_id", _STR),
        ("task_run_id", _STR),
        ("task", _STR),
        ("kind", _STR),
        ("attempt", _U32),
        ("status", _STR),
        ("duration_ms", _F64),
        ("error_kind", _STR),
        ("error_message", _STR),
        ("retryable", _U8),
        ("directive", _STR),
        ("loop_id", _STR),
        ("iteration", _I64),
        ("worker_class", _STR),
        ("resource_type", _STR),
        ("units", _F64),
        ("cpu_ms", _F64),
        ("egress_bytes", _U64),
        ("provider", _STR),
        ("region", _STR),
        # measured usage (outcome.meta.usage, sql/V003__allocation.sql)
        ("playbook", _STR),
        ("mem_bytes", _U64),
        ("mem_peak_bytes", _U64),
        ("bytes_read", _U64),
        ("bytes_written", _U64),
        ("net_in_bytes", _U64),
        ("net_out_bytes", _U64),
        ("rows_moved", _U64),
        ("shots", _U64),
        ("qpu_seconds", _F64),  # sql/V004__quantum_prices.sql
    ],
    "frame_fact": COMMON
    + [
        ("step", _STR),
        ("loop_id", _STR),
        ("transition", _STR),
        ("iteration", _I64),
        ("total", _U64),
        ("ok", _U64),
        ("failed", _U64),
        ("mode", _STR),
        ("max_in_flight", _U32),
        ("duration_ms", _F64),
    ],
    "resource_fact": [("event_id", _STR), ("ordinal", _U16)]
    + COMMON[1:]
    + [
        ("step", _STR),
        ("task", _STR),
        ("event_name", _STR),
        ("action", _STR),
        ("uri", _STR),
        ("store", _STR),
        ("format", _STR),
        ("size_bytes", _U64),
        ("rows", _I64),
        ("checksum", _STR),
        ("schema_fingerprint", _STR),
    ],
    # the priced usage lines of each event (analytics/noetl_analytics/pricing.py usage_lines, sql/V006__one_price_path.sql)
    "usage_fact": [("event_id", _STR), ("ordinal", _U16)]
    + COMMON[1:]
    + [
        ("step", _STR),
        ("kind", _STR),
        ("category", _STR),
        ("item", _STR),
        ("unit", _STR),
        ("quantity", _F64),
        ("used", _F64),
        ("requested", _F64),
        ("key", _STR),
    ],
}
FACT_TABLES = tuple(SCHEMAS)
MAX_MESSAGE = 1000


def _ref(value: Any) -> dict[str, Any] | None:
    """The ``$ref`` body when ``value`` is a result reference envelope."""
    if type(value) is dict and len(value) == 1:
        body = value.get("$ref")
        if type(body) is dict:
            return body
    return None


def _error_parts(error: Any) -> tuple[Any, str, int]:
    if type(error) is dict:
        return (
            error.get("kind") or error.get("type") or "error",
            str(error.get("message") or "")[:MAX_MESSAGE],
            1 if error.get("retryable") else 0,
        )
    return "error", str(error)[:MAX_MESSAGE], 0


# -- coercion of a column Arrow refused (the slow path, value by value) ----------


def _as_text(value: Any) -> str | None:
    if value is None or type(value) is str:
        return value
    if type(value) is dict:  # a directive or an error given as a mapping
        for key in ("action", "do", "kind", "type", "message"):
            if isinstance(value.get(key), str):
                return value[key]
    try:
        return json.dumps(value, default=str, sort_keys=True)
    except (TypeError, ValueError):
        return str(value)


def _as_number(value: Any) -> float | None:
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, (int, float)):
        return float(value)
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def _as_count(value: Any) -> int | None:
    number = _as_number(value)
    return int(number) if number is not None and number >= 0 and number == number else None


def _as_int(value: Any) -> int | None:
    number = _as_number(value)
    return int(number) if number is not None and number == number else None


def _as_timestamp(value: Any) -> datetime | None:
    try:
        parsed = datetime.fromisoformat(str(value))
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def _coerce(values: tuple[Any, ...], typ: pa.DataType) -> pa.Array:
    if typ == _STR:
        fix: Callable[[Any], Any] = _as_text
    elif typ == _TS:
        fix = _as_timestamp
    elif typ == _F64:
        fix = _as_number
    elif typ == _I64:
        fix = _as_int
    else:
        fix = _as_count
    return pa.array([fix(v) for v in values], typ)


def _column(values: tuple[Any, ...], typ: pa.DataType) -> pa.Array:
    try:
        if typ is _TS:
            # ISO-8601 text -> timestamps in Arrow's C++ parser
            return pa.array(values, _STR).cast(_TS)
        return pa.array(values, typ)
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError, OverflowError):
        return _coerce(values, typ)


@contextmanager
def gc_paused() -> Iterator[None]:
    """Pause the cyclic GC while building rows: the tuples hold no cycles, and
    collections triggered by a million allocations would double the cost."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


_NO_USAGE: dict[str, Any] = {}
# events that may carry priced usage (analytics/noetl_analytics/pricing.py usage_lines)
_USAGE_EVENTS = frozenset(
    {
        ev.TASK_DONE,
        ev.STEP_DONE,
        ev.LOOP_ITERATION_DONE,
        ev.LOOP_DONE,
        ev.WORKFLOW_FINISHED,
        ev.PLAYBOOK_PROCESSED,
    }
)


class FactBuilder:
    """Accumulates fact rows as tuples (one list per table), in SCHEMAS column order."""

    def __init__(self) -> None:
        self.rows: dict[str, list[tuple[Any, ...]]] = {}
        self._playbooks: dict[
            str, str
        ] = {}  # execution -> playbook path, for task rows (kept across batches)
        # execution -> its stored references billed (engine/usage_lines.BilledRefs, the one rule): a
        # reference named again is no usage row (loop.done's list of them, a step passing one on)
        self._billed: dict[str, BilledRefs] = {}
        self.reset()
        self.events = 0
        self._handlers: dict[str, Callable[[ev.Event], None]] = {
            ev.EXECUTION_REQUESTED: self._execution,
            ev.WORKFLOW_STARTED: self._execution,
            ev.WORKFLOW_FINISHED: self._execution,
            ev.PLAYBOOK_PROCESSED: self._execution,
            ev.STEP_DONE: self._step,
            ev.STEP_FAILED: self._step,
            ev.STEP_SKIPPED: self._step,
            ev.TASK_DONE: self._task,
            ev.LOOP_STARTED: self._frame,
            ev.LOOP_ITERATION_DONE: self._iteration,
            ev.LOOP_ITERATION_FAILED: self._iteration,
            ev.LOOP_DONE: self._frame,
            ev.STEP_SCHEDULED: self._scheduled,
        }

    def reset(self) -> None:
        self.rows = {t: [] for t in SCHEMAS}
        self._execution_rows = self.rows["execution_fact"]
        self._step_rows = self.rows["step_fact"]
        self._task_rows = self.rows["task_fact"]
        self._frame_rows = self.rows["frame_fact"]
        self._resource_rows = self.rows["resource_fact"]
        self._usage_rows = self.rows["usage_fact"]

    def add(self, events: Iterable[ev.Event]) -> int:
        """Add events; returns how many were seen."""
        handlers = self._handlers
        n = 0
        for e in events:
            n += 1
            handler = handlers.get(e.name)
            if handler is not None:
                handler(e)
                if e.name in _USAGE_EVENTS:
                    self._usage(e)
        self.events += n
        return n

    # -- per-table row builders (tuples in SCHEMAS order) -------------------------

    def _execution(self, e: ev.Event) -> None:
        d = e.data if type(e.data) is dict else {}
        name = e.name
        playbook = playbook_name = duration = None
        if name == ev.EXECUTION_REQUESTED:
            transition = status = "requested"
            playbook = d.get("playbook")
            playbook_name = d.get("name")
            if type(playbook) is str:
                if len(self._playbooks) > 200_000:
                    self._playbooks.clear()
                self._playbooks[e.execution_id] = playbook
        elif name == ev.WORKFLOW_STARTED:
            transition, status = "started", "running"
        elif name == ev.WORKFLOW_FINISHED:
            transition = "finished"
            status = d.get("status") or ("failed" if e.status == "error" else "completed")
            duration = d.get("duration_ms")
        else:
            transition, status = "processed", d.get("status")
        self._execution_rows.append(
            (
                e.event_id, e.timestamp, e.tenant_id, e.project_id, e.execution_id,
                e.parent_execution_id or d.get("parent_execution_id"),
                playbook, playbook_name, transition, status, duration, d.get("region"), d.get("shard"),
            )
        )  # fmt: skip

    def _step(self, e: ev.Event) -> None:
        d = e.data if type(e.data) is dict else {}
        name = e.name
        kind = message = None
        if name == ev.STEP_DONE:
            outcome = "done"
            ref = _ref(d.get("result"))
            if ref is not None:
                self._resource(e, 0, "created", ref, None)
        elif name == ev.STEP_FAILED:
            outcome = "failed"
            kind, message, _ = _error_parts(d.get("error") or "step failed")
        else:
            outcome, message = "skipped", d.get("reason")
        self._step_rows.append(
            (
                e.event_id, e.timestamp, e.tenant_id, e.project_id, e.execution_id,
                e.step, e.step_run_id, outcome, d.get("duration_ms"), kind, message,
            )
        )  # fmt: skip

    def _task(self, e: ev.Event) -> None:
        d = e.data if type(e.data) is dict else {}
        outcome = d.get("outcome")
        if type(outcome) is not dict:
            outcome = {}
        meta = outcome.get("meta")
        if type(meta) is not dict:
            meta = {}
        task = d.get("task")
        kind = d.get("kind")
        attempt = e.attempt or meta.get("attempt") or 1
        duration = meta.get("duration_ms")
        error = outcome.get("error")
        if error:
            err_kind, err_message, retryable = _error_parts(error)
        else:
            err_kind = err_message = None
            retryable = 0
        status = outcome.get("status") or ("error" if e.status == "error" else "ok")
        usage = meta.get("usage")
        if type(usage) is not dict:
            usage = _NO_USAGE
        egress = meta.get("egress_bytes")
        if egress is None:
            egress = usage.get("egress_bytes")
        if egress is None:
            http = outcome.get("http")
            if type(http) is dict:
                egress = http.get("request_bytes")
        cpu_ms = meta.get("cpu_ms")
        if cpu_ms is None and "cpu_s" in usage:
            cpu_ms = ((usage.get("cpu_s") or 0) + (usage.get("child_cpu_s") or 0)) * 1000
        self._task_rows.append(
            (
                e.event_id, e.timestamp, e.tenant_id, e.project_id, e.execution_id,
                e.step, e.step_run_id, e.task_run_id, task, kind, attempt, status, duration,
                err_kind, err_message, retryable, d.get("directive"), e.loop_id, e.iteration,
                meta.get("worker_class") or d.get("worker_class"), meta.get("resource_type"), meta.get("units"),
                cpu_ms, egress, meta.get("provider"), meta.get("region"),
                self._playbooks.get(e.execution_id), usage.get("mem_delta_bytes"), usage.get("mem_peak_bytes"),
                usage.get("bytes_read"), usage.get("bytes_written"), usage.get("net_in_bytes"), usage.get("net_out_bytes"),
                usage.get("rows"), usage.get("shots"), usage.get("qpu_s"),
            )
        )  # fmt: skip
        result = outcome.get("result")
        if type(result) is dict:
            self._task_result_refs(e, result, task)

    def _task_result_refs(self, e: ev.Event, result: dict[str, Any], task: Any) -> None:
        """A result offloaded by the engine (``$ref``), a table a storage tool published
        (``{uri: noetl://…, checksum, size, …}``), or a registry read (``{…, ref: {uri}}``)."""
        ref = _ref(result)
        if ref is not None:
            self._resource(e, 0, "created", ref, task)
            return
        uri = result.get("uri")
        if type(uri) is str and uri.startswith("noetl://") and "checksum" in result:
            self._resource(e, 0, "created", result, task)
            return
        read = result.get("ref")
        if type(read) is dict and str(read.get("uri") or "").startswith("noetl://"):
            self._resource(e, 0, "read", read, task)

    def _iteration(self, e: ev.Event) -> None:
        if e.name == ev.LOOP_ITERATION_DONE:
            transition = "iteration_done"
            data = e.data
            if type(data) is dict and data:
                ref = _ref(data.get("result"))
                if ref is not None:
                    self._resource(e, 0, "created", ref, None)
        else:
            transition = "iteration_failed"
        self._frame_rows.append(
            (
                e.event_id, e.timestamp, e.tenant_id, e.project_id, e.execution_id,
                e.step, e.loop_id, transition, e.iteration, None, None, None, None, None, None,
            )
        )  # fmt: skip

    def _frame(self, e: ev.Event) -> None:
        d = e.data if type(e.data) is dict else {}
        total = ok = failed = max_in_flight = mode = duration = None
        if e.name == ev.LOOP_STARTED:
            transition = "started"
            total = d.get("total")
            mode = d.get("mode")
            max_in_flight = d.get("max_in_flight")
        else:
            transition = "done"
            duration = d.get("duration_ms")
            result = d.get("result")
            stats = d.get("stats")
            ref = _ref(result)
            if ref is not None:
                self._resource(e, 0, "created", ref, None)
            elif type(result) is dict:
                stats = stats or result.get("stats")
                items = result.get("results")
                if type(items) is list:
                    ordinal = 1
                    for item in items:
                        item_ref = _ref(item)
                        if item_ref is not None:
                            self._resource(e, ordinal, "created", item_ref, None)
                            ordinal += 1
            if type(stats) is dict:
                total, ok, failed = stats.get("total"), stats.get("ok"), stats.get("failed")
        self._frame_rows.append(
            (
                e.event_id, e.timestamp, e.tenant_id, e.project_id, e.execution_id,
                e.step, e.loop_id, transition, e.iteration, total, ok, failed, mode, max_in_flight, duration,
            )
        )  # fmt: skip

    def _scheduled(self, e: ev.Event) -> None:
        args = e.data.get("args") if type(e.data) is dict else None
        if not args or type(args) is not dict:
            return
        ordinal = 0
        for value in args.values():
            ref = _ref(value)
            if ref is not None:
                self._resource(e, ordinal, "read", ref, None)
                ordinal += 1

    def _resource(self, e: ev.Event, ordinal: int, action: str, ref: dict[str, Any], task: Any) -> None:
        self._resource_rows.append(
            (
                e.event_id, ordinal, e.timestamp, e.tenant_id, e.project_id, e.execution_id,
                e.step, task, e.name, action, ref.get("uri"), ref.get("store"), ref.get("format"),
                ref.get("size"), ref.get("rows"), ref.get("checksum"), ref.get("schema_fingerprint"),
            )
        )  # fmt: skip

    def _usage(self, e: ev.Event) -> None:
        kind = e.data.get("kind") if e.name == ev.TASK_DONE and type(e.data) is dict else None
        billed = self._billed.get(e.execution_id)
        if billed is None:
            if len(self._billed) > 20_000:
                self._billed.clear()  # billed again: one row more, the priced table keeps one per execution, key
            billed = self._billed[e.execution_id] = BilledRefs()
        # ordinals of all the event's lines: an event re-sent in another batch gets the same keys
        lines = usage_lines(e.name, e.data)
        foreign = (
            foreign_refs(e.name, e.data, e.execution_id) if any(line.key for line in lines) else frozenset()
        )
        for i, line in enumerate(lines):
            if line.key and not billed.billable(line.key, foreign):
                continue
            self._usage_rows.append(
                (
                    e.event_id, i, e.timestamp, e.tenant_id, e.project_id, e.execution_id, e.step,
                    line.kind or kind, line.category, line.item, line.unit, line.quantity, line.used,
                    line.requested, line.key,
                )
            )  # fmt: skip

    # -- Arrow -------------------------------------------------------------------

    def tables(self) -> dict[str, pa.Table]:
        """The accumulated rows as Arrow tables (empty tables omitted)."""
        out = {}
        for table, cols in SCHEMAS.items():
            rows = self.rows[table]
            if not rows:
                continue
            arrays = [
                _column(values, typ) for (_, typ), values in zip(cols, zip(*rows, strict=True), strict=True)
            ]
            out[table] = pa.Table.from_arrays(arrays, names=[n for n, _ in cols])
        return out


class FactWriter:
    """Writes events as facts into a :class:`FactsStore` (Arrow batches)."""

    def __init__(self, store: FactsStore, *, batch_events: int = 100_000):
        if batch_events <= 0:
            raise ValueError("batch_events must be positive")
        self.store = store
        self.batch_events = batch_events

    def write(self, events: Iterable[ev.Event]) -> dict[str, int]:
        """Insert the facts of ``events``; returns rows inserted per table."""
        counts = dict.fromkeys(FACT_TABLES, 0)
        it = iter(events)
        while chunk := list(islice(it, self.batch_events)):
            self._write_chunk(chunk, counts)
        return counts

    def write_batch(self, events: list[ev.Event]) -> dict[str, int]:
        """Like :meth:`write` for an in-memory list (slices instead of an iterator)."""
        counts = dict.fromkeys(FACT_TABLES, 0)
        for i in range(0, len(events), self.batch_events):
            self._write_chunk(events[i : i + self.batch_events], counts)
        return counts

    def _write_chunk(self, events: list[ev.Event], counts: dict[str, int]) -> None:
        builder = FactBuilder()
        with gc_paused():
            builder.add(events)
            tables = builder.tables()
        for table, data in tables.items():
            self.store.insert_arrow(table, data)
            counts[table] += data.num_rows
