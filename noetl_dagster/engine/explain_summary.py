"""An execution's summary as rows, and paging a loop's iterations from the log (issue 36).

The summary is :class:`~noetl_dagster.engine.explain.Explainer`'s state: row 0 the execution
(its counters, arcs, platform ledger; ``last_sequence``: the last event folded), row ``n`` the
``n``-th step run (its loop compact). The event stores write the rows that changed in the
transaction (or statement) that appends the events (:class:`SummaryCache`), so the summary
never runs ahead of the log; a summary behind the log (an execution recorded before summaries,
or appended to where the summary could not be kept) is brought up to date by folding the events
after its ``last_sequence``, and a missing one by folding the whole log (:func:`rebuild`).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from noetl_dagster.engine.events import Event
from noetl_dagster.engine.explain import _RUN, Explainer, _Loop, _run_fields, run_from_row
from noetl_dagster.engine.usage_lines import BilledRefs
from noetl_dagster.util.jsonutil import dumps, loads

Row = tuple[
    int, str
]  # (ord, JSON body): 0 the execution, n the n-th step run, BILLED + c a chunk of billed refs
# the stored references the execution billed (usage_lines.BilledRefs), in chunks of BilledRefs.CHUNK keys
# from this ord on: a full chunk is written once, so a loop storing a result per iteration rewrites one
# chunk, not all of them (runs are at most the execution's events: far below)
BILLED = 1 << 30
_LOOP = ("loop_id", "total", "mode", "ok", "failed", "retries", "attempts", "detail", "size", "start", "end",
         "failed_detail", "dmin", "dmax", "gran")  # fmt: skip


def _loop_state(lp: _Loop) -> dict[str, Any]:
    st = {k: getattr(lp, k) for k in _LOOP}
    st["buckets"] = [[k, *v] for k, v in lp.buckets.items()]
    st["open"] = [[k, *v] for k, v in lp.open.items()]
    st["hist"] = [[k, v] for k, v in lp.hist.items()]
    st["seqix"] = [[k, *v] for k, v in lp.seqix.items()]
    return st


def _loop_from(st: dict[str, Any]) -> _Loop:
    lp = _Loop.__new__(_Loop)
    for k in _LOOP:
        setattr(lp, k, st[k])
    lp.buckets = {int(r[0]): list(r[1:]) for r in st["buckets"]}
    lp.open = {int(r[0]): list(r[1:]) for r in st["open"]}
    lp.hist = {int(k): int(v) for k, v in st["hist"]}
    lp.seqix = {int(r[0]): list(r[1:]) for r in st["seqix"]}
    return lp


def state_rows(f: Explainer, everything: bool = False) -> list[Row]:
    """The rows changed since the last call (``everything``: all of them), and forget the changes."""
    dirty = range(1, len(f.order) + 1) if everything else sorted(f.dirty)
    rows: list[Row] = []
    for n in dirty:
        r = f.order[n - 1]
        if type(r) is str:  # a finished run, its row made as it finished (Explainer._freeze)
            rows.append((n, r))
            continue
        # a list, _RUN's fields then the loop and whether the run is indexed (no keys: a smaller row)
        st = [
            *_run_fields(r),
            _loop_state(r.loop) if r.loop is not None else None,
            f.runs.get(r.step_run_id or "") is r,
        ]
        rows.append((n, dumps(st)))
    billed, size = f.billed, BilledRefs.CHUNK
    for c in range(0 if everything else billed.saved // size, -(-len(billed.order) // size)):
        rows.append((BILLED + c, dumps(billed.order[c * size : (c + 1) * size])))
    billed.saved = len(billed.order)
    head = {"ex": f.ex, "t0": f.t0, "t_last": f.t_last, "ledger": f.ledger, "runs": len(f.order),
            "arcs": [[a, i, b, k] for (a, i, b), k in f.arcs.items()], "billed": len(billed.order)}  # fmt: skip
    f.dirty.clear()
    return [(0, dumps(head)), *rows]


def restore(rows: Iterable[tuple[int, str | bytes]]) -> Explainer | None:
    """The fold the rows hold (None: no header, or runs missing or unreadable)."""
    by = dict(rows)
    if 0 not in by:
        return None
    try:
        head = loads(by[0])
        f = Explainer()
        f.ex, f.t0, f.t_last, f.ledger = head["ex"], head["t0"], head["t_last"], head["ledger"]
        f.arcs = {(a, int(i), b): int(k) for a, i, b, k in head["arcs"]}
        n_billed, size = int(head["billed"]), BilledRefs.CHUNK  # (a summary without it: folded anew)
        order = [key for c in range(-(-n_billed // size)) for key in loads(by[BILLED + c])]
        if len(order) != n_billed:
            return None
        f.billed = BilledRefs(order)
        for n in range(1, int(head["runs"]) + 1):
            st = loads(by[n])
            if type(st) is not list or len(st) != len(_RUN) + 2:
                return None
            r = run_from_row(st)
            r.loop = _loop_from(st[-2]) if st[-2] is not None else None
            f.order.append(r)
            if st[-1]:
                f.runs[r.step_run_id or ""] = r
    except (KeyError, TypeError, ValueError):
        return None
    return f


def rebuild(events: Iterable[Event]) -> Explainer:
    """The summary from the log alone (what the stores would have written append by append)."""
    return Explainer().feed(events)


WRITE_EVERY = 256  # events folded between two writes of the summary at most (and at the end)
# An execution of fewer events has no summary written by its appends (nor a fold kept): a reader
# folds its whole log, which is that short, and writes it back (issue 35: a five-step execution
# paid ~0.4 ms of client CPU for a summary nothing had asked for yet).
CATCH_UP = 4096  # a stored summary this far behind is brought up to date from the log by the writer
_FINAL = frozenset({"workflow.finished", "playbook.processed"})


def _final(events: Sequence[Event]) -> bool:
    for e in events[-4:]:
        if e.name in _FINAL:
            return True
    return False


class SummaryCache:
    """The folds a store keeps up to date as it appends (a few executions, least recently used
    dropped). :meth:`fold` folds a batch of one execution's new events, numbered, onto the fold at
    ``base`` (the sequence before them) and returns the rows to write in the same transaction:
    every ``WRITE_EVERY`` events and with the execution's last events (the summary's own
    ``last_sequence`` says how far it goes; readers fold the few after it), else ``[]``; an
    execution that ends before ``WRITE_EVERY`` events is never folded nor written (left alone, so a
    late event costs nothing either): a snapshot plus a tail, where a short log is all tail. A fold
    not at ``base`` (another process appended, or this one was dropped) is loaded with ``load``
    (the stored rows) and brought to ``base`` with ``read(execution_id, after, until)`` when it is
    at most ``CATCH_UP`` behind; otherwise the execution is left alone (None: its summary stays
    behind, and readers fold the rest). The events between two writes are kept and folded at the
    write, in one pass (``_queued``): the fold's code runs warm, once per write, not cold once per
    append between the engine's own work (about half the fold's cost in an engine run)."""

    def __init__(self, size: int = 32):
        self._folds: OrderedDict[str, Explainer | None] = OrderedDict()
        self._at: dict[str, int] = {}
        self._pending: dict[str, int] = {}
        self._queued: dict[str, list[Event]] = {}  # events received, not folded yet (up to a write)
        self.size = size

    def fold(self, execution_id: str, base: int, events: Sequence[Event],
             load: Callable[[str], tuple[int, list[tuple[int, Any]]] | None],
             read: Callable[[str, int, int], list[Event]]) -> list[Row] | None:  # fmt: skip
        f = self._folds.get(execution_id)
        if self._at.get(execution_id) == base and f is None:  # left alone: no query per append
            self._remember(execution_id, None, base + len(events))
            return None
        try:
            if f is None or self._at.get(execution_id) != base:
                self._queued.pop(execution_id, None)
                f = self._load(execution_id, base, load, read)
        except Exception:  # noqa: BLE001 - a summary it cannot restore never fails the append: left alone
            f = None
        if f is None:
            self._remember(execution_id, None, base + len(events))
            return None
        self._remember(execution_id, f, base + len(events))
        queued = self._queued.get(execution_id)
        if queued is None:
            queued = self._queued[execution_id] = []
        queued.extend(events)
        pending = self._pending.get(execution_id, 0) + len(events)
        if pending < WRITE_EVERY:
            if not _final(events):
                self._pending[execution_id] = pending
                return []
            if base + len(events) < WRITE_EVERY:  # a short execution ended: its log is the summary's tail
                self._queued.pop(execution_id, None)
                self._pending.pop(execution_id, None)
                self._remember(execution_id, None, base + len(events))
                return None
        self._pending[execution_id] = 0
        del self._queued[execution_id]
        try:
            f.feed(queued)
        except Exception:  # noqa: BLE001 - an event the fold cannot read never fails the append: left alone
            self._remember(execution_id, None, base + len(events))
            return None
        return state_rows(f)

    def _load(self, execution_id: str, base: int, load: Callable[[str], tuple[int, list[tuple[int, Any]]] | None],
              read: Callable[[str, int, int], list[Event]]) -> Explainer | None:  # fmt: skip
        got = load(execution_id) if base else None
        at = got[0] if got is not None else 0
        if at > base or base - at > CATCH_UP:
            return None
        f = restore(got[1]) if got is not None else Explainer()
        if f is None:
            return None
        if at < base:
            f.feed(read(execution_id, at, base))
            if f.ex["last_sequence"] != base:
                return None
        self._pending[execution_id] = base - at
        return f

    def at(self, execution_id: str) -> int | None:
        """The last sequence this cache folded (or left alone) for the execution; None: unknown."""
        return self._at.get(execution_id)

    def _remember(self, execution_id: str, f: Explainer | None, at: int) -> None:
        self._folds[execution_id] = f
        self._at[execution_id] = at
        self._folds.move_to_end(execution_id)
        while len(self._folds) > self.size:
            old, _ = self._folds.popitem(last=False)
            self._at.pop(old, None)
            self._pending.pop(old, None)
            self._queued.pop(old, None)

    def forget(self, execution_ids: Iterable[str] | None = None) -> None:
        """After a failed write: these folds (None: all) may be ahead of what is stored."""
        for eid in list(self._folds) if execution_ids is None else execution_ids:
            self._folds.pop(eid, None)
            self._at.pop(eid, None)
            self._pending.pop(eid, None)
            self._queued.pop(eid, None)
