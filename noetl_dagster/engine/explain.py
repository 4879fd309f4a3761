"""What happened inside one execution, from its events alone (issue 36).

:func:`explain` folds an execution's log in one pass into what ``noetl-dagster explain``
prints and the dashboard's execution page draws: every step run (its tokens, input, task
attempts and retries, result reference or error, fired arcs, measured usage and cost), loops
aggregated (counts, duration percentiles, iterations in at most ``BUCKETS`` buckets plus the
first ``DETAIL`` in detail: a 200,000-item loop stays a few hundred rows;
:meth:`Explanation.iterations` pages through the rest), sub-playbook executions, and the tokens that passed each arc.

The fold's state is small whatever the log's size (loops compact, see :class:`_Loop`): the
event stores keep it beside the log as the execution's summary, updated in the transaction of
each append (``engine/explain_summary.py``), so the page and ``explain`` read the summary and
the events after it rather than the whole log, and a page of iterations reads its stretch.

Nothing here imports Dagster or the analytics package: each step run keeps a ledger of its
usage lines (``engine/usage_lines.py``, by category, item, kind and day) and a cost comes from
an optional ``price(ledger) -> float`` the caller passes to :meth:`Explainer.result` (the
execution's own lines - its platform line - count to ``platform_cost``).
"""

from __future__ import annotations

import hashlib
import math
from bisect import bisect_right
from collections.abc import Callable, Iterable
from datetime import datetime
from operator import attrgetter
from typing import Any

from noetl_dagster.engine.error_location import code_frame, run_error_line
from noetl_dagster.engine.events import Event
from noetl_dagster.engine.usage_lines import _REF_EVENTS, _TERMINAL, BilledRefs
from noetl_dagster.util.jsonutil import dumps, loads, sorted_json

DETAIL = 50  # loop iterations kept one by one (the first ones, and failed ones up to this many)
BUCKETS = 60  # the rest of a loop's iterations, by index range
SEQIX_CHUNKS = 512  # where in the log a loop's iterations lie: at most this many ranges (paging reads one)
SEQIX_MIN = 256  # iterations per range at least
PREVIEW = 400  # characters of a value's JSON shown inline
USAGE_SUM = ("cpu_s", "child_cpu_s", "wall_s", "bytes_read", "bytes_written", "net_in_bytes", "net_out_bytes",
             "egress_bytes", "rows")  # fmt: skip

LedgerPrice = Callable[[dict[str, float]], float]  # a run's ledger -> its cost (analytics prices it)
_PRICED = frozenset({"task.done", *_TERMINAL, *_REF_EVENTS})  # the events with usage lines
# events that only count (the routing's bookkeeping, nothing of them is shown): not folded further
_UNTIMED = frozenset({"token.enqueued", "ctx.patched", "loop.frame.claimed", "loop.frame.committed"})


class UnknownExecution(KeyError):
    """No events for this execution id (one line for the CLI, 404 for the page)."""

    def __str__(self) -> str:
        return str(self.args[0])


_SECONDS: dict[str, int] = {}  # "YYYY-MM-DDTHH:MM:SS+HH:MM" -> epoch seconds (one parse per second of events)


def _ms(ts: str) -> float:
    """An event's ISO time as epoch ms; the engine's form (microseconds and an offset) from the
    parse of its second, bit for bit what ``fromisoformat(ts).timestamp() * 1000`` gives (both
    divide the same whole number of microseconds by 10**6)."""
    if len(ts) == 32 and ts[19] == "." and ts[20:26].isdigit():
        key = ts[:19] + ts[26:]
        sec = _SECONDS.get(key)
        if sec is None:
            if len(_SECONDS) >= 4096:
                _SECONDS.clear()
            sec = _SECONDS[key] = int(datetime.fromisoformat(key).timestamp())
        return (sec * 1_000_000 + int(ts[20:26])) / 1_000_000 * 1000.0
    return datetime.fromisoformat(ts).timestamp() * 1000.0


def checksum(value: Any) -> str:
    """A short, stable digest of a JSON value (a payload reference: its own checksum); keys
    sorted, so equal values digest alike whatever their key order."""
    if isinstance(value, dict) and isinstance(value.get("$ref"), dict) and value["$ref"].get("checksum"):
        return str(value["$ref"]["checksum"])[:24]
    return hashlib.sha256(sorted_json(value)).hexdigest()[:16]


_DIGESTS: dict[str, str] = {}  # a short value's JSON -> its checksum (a step's args/result repeat: {}, ...)


def brief(value: Any) -> dict[str, Any]:
    """A value as the page shows it: a payload reference as is, else a short JSON preview."""
    if isinstance(value, dict) and isinstance(value.get("$ref"), dict):
        return {"ref": value["$ref"], "checksum": checksum(value)}
    text = dumps(value)
    if len(text) > 128:
        return {"preview": text[:PREVIEW], "truncated": len(text) > PREVIEW, "checksum": checksum(value)}
    digest = _DIGESTS.get(text)  # equal JSON, equal value: equal digest (sorted keys)
    if digest is None:
        if len(_DIGESTS) >= 4096:
            _DIGESTS.clear()
        digest = _DIGESTS[text] = checksum(value)
    return {"preview": text, "truncated": False, "checksum": digest}


def _has_ref(result: Any) -> bool:
    """Whether a step/iteration/loop result may name a stored reference (usage_lines.created_refs:
    ``{"$ref": ...}``, or loop.done's list of them): an inline result has no usage line to fold."""
    return type(result) is dict and ("$ref" in result or "results" in result)


def _error_of(data: dict[str, Any]) -> dict[str, Any] | None:
    err = data.get("error")
    if err is None and isinstance(data.get("outcome"), dict):
        err = data["outcome"].get("error")
    if err is None:
        return None
    return err if isinstance(err, dict) else {"message": str(err)}


def _add_usage(total: dict[str, float], usage: Any) -> None:
    if not isinstance(usage, dict):
        return
    for k in USAGE_SUM:
        if k not in usage:
            continue
        v = usage[k]
        if isinstance(v, int | float):
            total[k] = total.get(k, 0.0) + v
    peak = usage.get("mem_peak_bytes")
    if isinstance(peak, int | float) and peak > total.get("mem_peak_bytes", 0):
        total["mem_peak_bytes"] = peak


class _Loop:
    """One loop's iterations, compact (a few KB whatever the loop's size): counters, buckets by
    index, a duration histogram (min, max, percentiles), the first ``DETAIL`` iterations and up to
    ``DETAIL`` failed ones in detail (with the sequence of the event that ended them), and where in
    the log each range of ``gran`` iterations lies (``seqix``: chunk -> [first, last] sequence), so a
    page of iterations reads only its stretch of the log (:func:`explain_summary.page_iterations`)."""

    __slots__ = ("loop_id", "total", "mode", "ok", "failed", "retries", "attempts", "detail", "buckets", "open",
                 "size", "start", "end", "failed_detail", "hist", "dmin", "dmax", "seqix", "gran")  # fmt: skip

    def __init__(self, loop_id: str, total: int, mode: str | None, start: float):
        self.loop_id, self.total, self.mode, self.start, self.end = loop_id, total, mode, start, start
        self.ok = self.failed = self.retries = self.attempts = self.failed_detail = 0
        self.detail: list[dict[str, Any]] = []
        self.buckets: dict[int, list[float]] = {}  # index -> [start, end, ok, failed, retries, busy_ms]
        self.open: dict[int, list[Any]] = {}  # iteration -> [start, attempts] while it runs
        self.size = max(1, -(-total // BUCKETS)) if total else 1000  # a cursor loop's total is unknown
        self.hist: dict[int, int] = {}  # duration bin (see _bin) -> iterations
        self.dmin = self.dmax = -1.0
        self.gran = max(SEQIX_MIN, -(-total // SEQIX_CHUNKS)) if total else 4 * SEQIX_MIN
        self.seqix: dict[int, list[int]] = {}

    def seen(self, i: int, seq: int | None) -> None:
        if seq is None or i < 0:
            return
        r = self.seqix.get(i // self.gran)
        if r is None:
            self.seqix[i // self.gran] = [seq, seq]
        elif seq < r[0]:
            r[0] = seq
        elif seq > r[1]:
            r[1] = seq

    def done(self, i: int, t: float, ok: bool, err: dict[str, Any] | None, seq: int | None = None) -> None:
        start, attempts = self.open.pop(i, (t, 1))[:2]
        retries = max(0, attempts - 1)
        self.end = max(self.end, t)
        if ok:
            self.ok += 1
        else:
            self.failed += 1
        self.retries += retries
        d = t - start
        self.dmin = d if self.dmin < 0 or d < self.dmin else self.dmin
        self.dmax = max(self.dmax, d)
        k = _bin(d)
        self.hist[k] = self.hist.get(k, 0) + 1
        b = self.buckets.get(i // self.size)
        if b is None:
            b = self.buckets[i // self.size] = [start, t, 0, 0, 0, 0.0]
        b[0], b[1] = min(b[0], start), max(b[1], t)
        b[2 if ok else 3] += 1
        b[4] += retries
        b[5] += d
        if i < DETAIL or (not ok and self.failed_detail < DETAIL):
            self.failed_detail += not ok
            row = _iteration(i, start, t, ok, retries, err)
            row["sequence"] = seq
            self.detail.append(row)

    def durations(self) -> dict[str, Any]:
        n = self.ok + self.failed
        out: dict[str, Any] = {
            "min_ms": round(self.dmin, 3) if n else None,
            "max_ms": round(self.dmax, 3) if n else None,
        }
        for q in (50, 90, 99):
            out[f"p{q}_ms"] = _percentile(self.hist, n, q / 100, self.dmin, self.dmax) if n else None
        return out

    def out(self, t0: float) -> dict[str, Any]:
        buckets = []
        for k in sorted(self.buckets):
            s, e, ok, failed, retries, busy = self.buckets[k]
            hi = (k + 1) * self.size - 1
            buckets.append({"first": k * self.size, "last": min(hi, self.total - 1) if self.total else hi,
                            "start_ms": round(s - t0, 3), "end_ms": round(e - t0, 3), "ok": ok, "failed": failed,
                            "retries": retries, "busy_ms": round(busy, 3)})  # fmt: skip
        return {
            "loop_id": self.loop_id, "total": self.total, "mode": self.mode, "ok": self.ok, "failed": self.failed,
            "retries": self.retries, "attempts": self.attempts, "running": len(self.open),
            "iterations": [_relative(d, t0) for d in sorted(self.detail, key=lambda d: d["index"])],
            "buckets": buckets, "bucket_size": self.size, "durations": self.durations(),
        }  # fmt: skip


def _bin(d: float) -> int:
    """A duration's histogram bin: 0 below 0.01 ms, then four bins per doubling (each ~19% wide)."""
    return 0 if d < 0.01 else int(4 * math.log2(d / 0.01)) + 1


def _percentile(hist: dict[int, int], n: int, q: float, lo: float, hi: float) -> float:
    """The q-quantile of the durations, to a bin's width: the upper edge of the bin holding it,
    within the measured minimum and maximum."""
    want, acc = q * n, 0
    for k in sorted(hist):
        acc += hist[k]
        if acc >= want:
            edge = 0.01 if k == 0 else 0.01 * 2 ** (k / 4)
            return round(min(max(edge, lo), hi), 3)
    return round(hi, 3)


def _iteration(
    i: int, start: float, end: float, ok: bool, retries: int, err: dict[str, Any] | None
) -> dict[str, Any]:
    return {"index": i, "start": start, "end": end, "status": "success" if ok else "error", "retries": retries,
            "error": err}  # fmt: skip


def _relative(row: dict[str, Any], t0: float) -> dict[str, Any]:
    """Absolute ``start``/``end`` (epoch ms, kept while folding) -> ``start_ms``/``end_ms`` from the first event."""
    out = {k: v for k, v in row.items() if k not in ("start", "end")}
    out["start_ms"], out["end_ms"] = round(row["start"] - t0, 3), round(row["end"] - t0, 3)
    return out


class _Run:
    """One activation of a step; ``ord``: its place in the execution (1, 2, ...), the key of its
    summary row. ``ledger``: its priced quantities (usage lines summed by category, item, kind and
    day: a price table prices them when the page is built; a stored reference counts with the first
    run that names it, see usage_lines.BilledRefs)."""

    __slots__ = ("ord", "step", "step_run_id", "seq", "scheduled", "start", "end", "status", "args", "tokens",
                 "attempts", "open", "loop", "result", "error", "fired", "usage", "ledger", "subs", "reason")  # fmt: skip

    def __init__(self, ev: Event, t: float, ord_: int):
        d = ev.data if isinstance(ev.data, dict) else {}
        self.ord, self.step, self.step_run_id, self.seq = ord_, ev.step or "", ev.step_run_id, ev.sequence
        self.scheduled = self.start = self.end = t
        self.status = "running"
        self.args = brief(d.get("args"))
        self.tokens = len(d.get("token_ids") or ()) or 1
        self.attempts: list[dict[str, Any]] = []
        self.open: dict[str, float] = {}  # task_run_id -> start
        self.loop: _Loop | None = None
        self.result: dict[str, Any] | None = None
        self.error: dict[str, Any] | None = None
        self.fired: list[dict[str, Any]] = []
        self.usage: dict[str, float] = {}
        self.ledger: dict[str, float] = {}
        self.subs: list[str] = []
        self.reason: str | None = None

    def out(self, t0: float, price: LedgerPrice | None) -> dict[str, Any]:
        retries = sum(1 for a in self.attempts if a["attempt"] > 1) + (self.loop.retries if self.loop else 0)
        return {
            "step": self.step, "step_run_id": self.step_run_id, "sequence": self.seq, "line": None,
            "status": self.status, "start_ms": round(self.start - t0, 3), "end_ms": round(self.end - t0, 3),
            "duration_ms": round(self.end - self.start, 3), "tokens": self.tokens, "args": self.args,
            "attempts": [_relative(a, t0) for a in self.attempts],
            "retries": retries, "loop": self.loop.out(t0) if self.loop else None, "result": self.result,
            "error": self.error, "fired": self.fired, "usage": self.usage,
            "cost": round(price(self.ledger), 9) if price is not None and self.ledger else 0.0,
            "sub_executions": self.subs, "reason": self.reason,
        }  # fmt: skip


# a step run's fields as its summary row holds them (explain_summary.state_rows), in this order
_RUN = ("ord", "step", "step_run_id", "seq", "scheduled", "start", "end", "status", "args", "tokens", "attempts",
        "open", "result", "error", "fired", "usage", "ledger", "subs", "reason")  # fmt: skip
_run_fields = attrgetter(*_RUN)


def run_from_row(st: list[Any]) -> _Run:
    """A step run from its summary row (``_RUN``'s fields, then its loop's state and whether it is
    indexed); its loop is left None (explain_summary restores it)."""
    r = _Run.__new__(_Run)
    for k, v in zip(_RUN, st, strict=False):
        setattr(r, k, v)
    r.loop = None
    return r


class Explanation:
    """``data``: the summary (JSON-ready); :meth:`iterations` pages through a loop's iterations,
    reading only the stretch of the log that holds them (``read_range(after, until)``)."""

    def __init__(self, data: dict[str, Any], loops: dict[str, _Loop], t0: float,
                 read_range: Callable[[int, int], list[Event]]):  # fmt: skip
        self.data, self._loops, self._t0, self._read_range = data, loops, t0, read_range

    def iterations(self, step_run_id: str, offset: int = 0, limit: int = 100) -> dict[str, Any]:
        """Iterations ``[offset, offset + limit)`` of the loop of one step run (limit at most 1000)."""
        loop = self._loops.get(step_run_id)
        if loop is None:
            raise UnknownExecution(f"no loop in step run {step_run_id!r}")
        offset, limit = max(0, int(offset)), max(1, min(int(limit), 1000))
        rows = page_iterations(self._read_range, loop, step_run_id, offset, limit, self._t0)
        return {"step_run_id": step_run_id, "offset": offset, "limit": limit, "total": loop.total,
                "finished": loop.ok + loop.failed, "iterations": rows}  # fmt: skip


def page_iterations(read_range: Callable[[int, int], list[Event]], loop: _Loop, step_run_id: str, offset: int,
                    limit: int, t0: float) -> list[dict[str, Any]]:  # fmt: skip
    """Iterations ``[offset, offset + limit)`` of one loop, finished ones, from the stretch of the
    log that holds them (the loop's ``seqix``), not the whole log."""
    chunks = [
        loop.seqix[c]
        for c in range(offset // loop.gran, (offset + limit - 1) // loop.gran + 1)
        if c in loop.seqix
    ]
    if not chunks:
        return []
    lo, hi = min(c[0] for c in chunks), max(c[1] for c in chunks)
    open_: dict[int, list[Any]] = {}
    rows: dict[int, dict[str, Any]] = {}
    for ev in read_range(lo - 1, hi):
        i = ev.iteration
        if ev.step_run_id != step_run_id or i is None or not offset <= i < offset + limit:
            continue
        name = ev.name
        if name == "loop.iteration.started":
            open_[i] = [_ms(ev.timestamp), 1]
        elif name == "task.started" and ev.loop_id and i in open_:
            open_[i][1] = ev.attempt or 1
        elif name in ("loop.iteration.done", "loop.iteration.failed"):
            t = _ms(ev.timestamp)
            start, attempts = open_.pop(i, (t, 1))
            ok = name == "loop.iteration.done"
            err = None if ok else _error_of(ev.data if isinstance(ev.data, dict) else {})
            rows[i] = _relative(_iteration(i, start, t, ok, max(0, attempts - 1), err), t0)
    return [rows[i] for i in sorted(rows)]


class Explainer:
    """The fold behind :func:`explain`, resumable: :meth:`feed` events as they come (in sequence
    order, from the first), :meth:`result` at any time. Its state is small (loops compact) and
    saved as rows (``explain_summary``): the event stores keep it beside the log, updated with
    each append, so a page reads the summary and the events after it, not the whole log."""

    def __init__(self, lines: dict[str, int] | None = None):
        self.lines = lines or {}
        self.playbook: Any = None  # the loaded playbook, when the caller has it: where each failure is
        self.runs: dict[str, _Run] = {}
        self.order: list[_Run] = []
        self.arcs: dict[tuple[str, int, str], int] = {}
        self.ex: dict[str, Any] = {"events": 0, "status": "running", "last_sequence": 0}
        self.t0: float | None = None
        self.t_last: float | None = None
        self.request: Event | None = None  # playbook.execution.requested: where the playbook is
        self.ledger: dict[str, float] = {}  # the execution's own (platform) lines
        self.billed = BilledRefs()  # stored references billed: once per execution, as every cost view
        self.dirty: set[int] = set()  # runs changed since the rows were last taken (0: the header)
        # finished runs (after next.evaluated, no loop), held as their summary row: a string is no
        # work for the garbage collector, and the row is made once; an event for one thaws it
        self.frozen: dict[str, int] = {}  # step_run_id -> ord

    def feed(self, events: Iterable[Event]) -> Explainer:
        ex, runs, order, arcs, dirty = self.ex, self.runs, self.order, self.arcs, self.dirty
        # counters kept in locals and stored once (the store folds every appended event: per-event
        # overhead is the summary's cost on cheap steps)
        count, last, t_last = 0, ex["last_sequence"], self.t_last
        try:
            for ev in events:
                count += 1
                seq = ev.sequence
                if seq is not None and seq > last:
                    last = seq
                name = ev.name
                if name in _UNTIMED and self.t0 is not None:
                    continue  # nothing of it is shown (time parsing is most of a small event's cost)
                t = _ms(ev.timestamp)
                if self.t0 is None:
                    self.t0 = t
                    ex.update(execution_id=ev.execution_id, tenant=ev.tenant_id, project=ev.project_id,
                              parent_execution_id=ev.parent_execution_id, started_at=ev.timestamp)  # fmt: skip
                if t_last is None or t > t_last:
                    t_last = t
                d = ev.data if isinstance(ev.data, dict) else {}
                run = runs.get(ev.step_run_id or "") if ev.step_run_id else None
                if run is None and ev.step_run_id in self.frozen:
                    run = self._thaw(ev.step_run_id or "")
                if name == "step.scheduled":
                    run = runs[ev.step_run_id or ""] = _Run(ev, t, len(order) + 1)
                    order.append(run)
                elif name == "step.skipped":
                    run = _Run(ev, t, len(order) + 1)
                    run.status, run.reason = "skipped", str(d.get("reason") or "")
                    order.append(run)
                if name in _PRICED and (
                    name == "task.done" or name in _TERMINAL or _has_ref(d.get("result"))
                ):
                    self._charge(run, name, d, t)  # (a step's inline result has no usage line)
                if run is None:
                    if name == "playbook.execution.requested":
                        self.request = ev
                        ex["request_sequence"] = ev.sequence
                    _execution_event(ex, name, d, ev)
                    continue
                dirty.add(run.ord)
                loop = run.loop
                if loop is not None and ev.iteration is not None and ev.step_run_id:
                    loop.seen(ev.iteration, ev.sequence)
                if name == "step.started":
                    run.start = t
                elif name == "task.started":
                    if ev.loop_id and loop is not None:
                        it = loop.open.get(ev.iteration if ev.iteration is not None else -1)
                        if it is not None:
                            it[1] = ev.attempt or 1
                    else:
                        run.open[ev.task_run_id or ""] = t
                elif name == "task.done":
                    _task_done(run, ev, d, t)
                elif name == "loop.started":
                    run.loop = _Loop(ev.loop_id or "", int(d.get("total") or 0), d.get("mode"), t)
                elif name == "loop.iteration.started" and loop is not None:
                    loop.open[ev.iteration if ev.iteration is not None else -1] = [t, 1]
                elif name in ("loop.iteration.done", "loop.iteration.failed") and loop is not None:
                    i = ev.iteration if ev.iteration is not None else -1
                    loop.done(i, t, name == "loop.iteration.done", _error_of(d), ev.sequence)
                elif name == "loop.done" and loop is not None:
                    loop.end = t
                elif name in ("step.done", "step.failed"):
                    run.end = t
                    run.status = "success" if name == "step.done" else "error"
                    if name == "step.done":
                        run.result = brief(d.get("result"))
                    run.error = _error_of(d)
                elif name == "next.evaluated":
                    run.fired = [{"arc": f.get("arc"), "step": f.get("step")} for f in d.get("fired") or ()
                                 if isinstance(f, dict)]  # fmt: skip
                    for f in run.fired:
                        key = (run.step, int(f["arc"]) if isinstance(f["arc"], int) else -1, str(f["step"]))
                        arcs[key] = arcs.get(key, 0) + 1
                    if d.get("unhandled_failure"):
                        run.status = "error"
                    if loop is None and runs.get(run.step_run_id or "") is run:
                        self._freeze(run)
        finally:
            ex["events"] += count
            ex["last_sequence"] = last
            self.t_last = t_last
        return self

    def _freeze(self, run: _Run) -> None:
        self.order[run.ord - 1] = dumps([*_run_fields(run), None, True])  # type: ignore[call-overload]
        sid = run.step_run_id or ""
        del self.runs[sid]
        self.frozen[sid] = run.ord

    def _thaw(self, sid: str) -> _Run:
        n = self.frozen.pop(sid)
        r = self.order[n - 1] = run_from_row(loads(self.order[n - 1]))  # type: ignore[arg-type]
        self.runs[sid] = r
        return r

    def _charge(self, run: _Run | None, name: str, d: dict[str, Any], t: float) -> None:
        """Add the event's billed usage lines to its run's ledger (the execution's without a run):
        a stored reference is billed once per execution, by the first event that names it
        (usage_lines.BilledRefs, the rule of the facts and of Dagster's cost metadata)."""
        lines = self.billed.lines(name, d, self.ex.get("execution_id"))
        if not lines:
            return
        ledger = run.ledger if run is not None else self.ledger
        day = int(t // 86_400_000)
        for category, item, quantity, _used, _requested, _key, kind in lines:
            k = f"{category}\t{item}\t{kind}\t{day}"
            ledger[k] = ledger.get(k, 0.0) + quantity

    def result(self, price: LedgerPrice | None = None,
               read_range: Callable[[int, int], list[Event]] | None = None) -> Explanation:  # fmt: skip
        """The summary of what was fed so far; UnknownExecution when nothing was. ``price``: a
        ledger's cost (analytics.execution_view.ledger_pricer); ``read_range(after, until)``: the
        log's events in a sequence range, for paging a loop's iterations."""
        t0 = self.t0
        if t0 is None:
            raise UnknownExecution("no events")
        ex = dict(self.ex)
        ex.pop("request_sequence", None)
        ex["duration_ms"] = round((self.t_last or t0) - t0, 3)
        for sid in list(self.frozen):
            self._thaw(sid)
        out_runs = [r.out(t0, price) for r in self.order]
        for r in out_runs:
            r["line"] = self.lines.get(r["step"])
            r["error_line"] = run_error_line(self.playbook, r)  # one rule with Dagster and diff
        platform_cost = price(self.ledger) if price is not None and self.ledger else 0.0
        ex["platform_cost"] = round(platform_cost, 9)
        loops = {r.step_run_id or "": r.loop for r in self.order if r.loop is not None}
        return Explanation({
            "execution": ex, "runs": out_runs, "steps": _per_step(out_runs),
            "arcs": [{"from": a, "arc": i, "to": b, "tokens": n} for (a, i, b), n in sorted(self.arcs.items())],
            "totals": _totals(out_runs, platform_cost),
        }, loops, t0, read_range or (lambda _a, _b: []))  # fmt: skip


def explain(events: Iterable[Event], *, price: LedgerPrice | None = None,
            lines: dict[str, int] | None = None, playbook: Any = None) -> Explanation:  # fmt: skip
    """The execution's runs, loops, arcs and totals (see the module doc); ``lines``: step -> line
    in the playbook file, ``playbook``: the loaded playbook (each failed run's ``error_line``), when the
    caller could load it. UnknownExecution for an empty log."""
    evs = list(events)
    seqs = [e.sequence or 0 for e in evs]

    def read_range(after: int, until: int) -> list[Event]:
        return evs[bisect_right(seqs, after) : bisect_right(seqs, until)]

    folder = Explainer(lines)
    folder.playbook = playbook
    return folder.feed(evs).result(price, read_range)


def _execution_event(ex: dict[str, Any], name: str, d: dict[str, Any], ev: Event) -> None:
    if name == "playbook.execution.requested":
        ex.update(playbook=d.get("playbook"), name=d.get("name"), file=d.get("file"),
                  request_workload=brief(d.get("workload")), requested_by=d.get("requested_by"))  # fmt: skip
        if d.get("definition"):
            ex["generated"] = True
    elif name == "workflow.started":
        ex["entry"] = d.get("entry")
    elif name == "workflow.finished":
        ex["status"] = d.get("status") or ev.status
        ex["finished_at"] = ev.timestamp
        if isinstance(d.get("platform"), dict):
            ex["platform_usage"] = d["platform"]
    elif name == "playbook.processed":
        ex["final_step"] = d.get("final_step")


def _task_done(run: _Run, ev: Event, d: dict[str, Any], t: float) -> None:
    outcome = d.get("outcome") if isinstance(d.get("outcome"), dict) else {}
    meta = outcome.get("meta") if isinstance(outcome.get("meta"), dict) else {}
    _add_usage(run.usage, meta.get("usage"))
    result = outcome.get("result")
    if d.get("kind") == "playbook" and isinstance(result, dict) and result.get("execution_id"):
        run.subs.append(str(result["execution_id"]))
    if ev.loop_id and run.loop is not None:
        run.loop.attempts += 1
        return
    start = run.open.pop(ev.task_run_id or "", t)
    run.attempts.append({
        "task": d.get("task"), "kind": d.get("kind"), "attempt": ev.attempt or meta.get("attempt") or 1,
        "status": ev.status, "start": start, "end": t, "duration_ms": meta.get("duration_ms"),
        "directive": d.get("directive"), "error": _error_of(outcome),
        "code_line": code_frame(outcome),  # the raising line in an inline code block (error_location)
    })  # fmt: skip


def _per_step(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    steps: dict[str, dict[str, Any]] = {}
    for r in runs:
        s = steps.setdefault(r["step"], {"step": r["step"], "line": r["line"], "runs": 0, "failed": 0, "skipped": 0,
                                         "retries": 0, "iterations": 0, "duration_ms": 0.0, "cost": 0.0,
                                         "cpu_s": 0.0})  # fmt: skip
        s["runs"] += r["status"] != "skipped"
        s["failed"] += r["status"] == "error"
        s["skipped"] += r["status"] == "skipped"
        s["retries"] += r["retries"]
        s["iterations"] += (r["loop"]["ok"] + r["loop"]["failed"]) if r["loop"] else 0
        s["duration_ms"] = round(s["duration_ms"] + r["duration_ms"], 3)
        s["cost"] = round(s["cost"] + r["cost"], 9)
        s["cpu_s"] = round(s["cpu_s"] + r["usage"].get("cpu_s", 0.0), 6)
    return list(steps.values())


def _totals(runs: list[dict[str, Any]], platform_cost: float) -> dict[str, Any]:
    return {
        "step_runs": sum(r["status"] != "skipped" for r in runs),
        "failed_runs": sum(r["status"] == "error" for r in runs),
        "retries": sum(r["retries"] for r in runs),
        "iterations": sum((r["loop"]["ok"] + r["loop"]["failed"]) if r["loop"] else 0 for r in runs),
        "cost": round(sum(r["cost"] for r in runs) + platform_cost, 9),
        "platform_cost": round(platform_cost, 9),
        "cpu_s": round(sum(r["usage"].get("cpu_s", 0.0) for r in runs), 6),
        "sub_executions": sum(len(r["sub_executions"]) for r in runs),
    }
