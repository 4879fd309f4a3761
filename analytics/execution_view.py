"""Explain and diff of executions for the CLI and the dashboard's execution pages (issue 36).

The engine folds the events (``engine/explain.py``, ``engine/execution_diff.py``); this adds
what lives above it: the price table (a step run's measured cost), the playbook's graph laid
out by networkx (layers of the condensation: a cycle's steps share a column), and, for the
server, a cache of explanations keyed by the execution's last sequence, so a big loop's
iterations page from memory and a finished execution is folded once. Every read on behalf of
a dashboard viewer passes :meth:`TenantScope.execution` first.
"""

from __future__ import annotations

import sqlite3
import threading
from collections import OrderedDict
from pathlib import Path
from typing import Any

import zstandard

from analytics.dashboard_access import TenantScope
from noetl_dagster.engine.events import Event
from noetl_dagster.engine.execution_diff import diff as diff_events
from noetl_dagster.engine.explain import Explainer, Explanation, UnknownExecution
from noetl_dagster.engine.explain_playbook import changed_steps, playbook_graph, playbook_of, step_lines

MAX_ID = 100
CACHE = 64  # executions kept by a server (a 200,000-iteration loop: ~6 MB)


def pricer(prices: str | None = None, data_dir: str | None = None) -> tuple[Any, str]:
    """(the priced usage lines of one event, currency) from the configured price table: the same
    lines and prices as the facts and Dagster's cost metadata (analytics.pricing.event_cost)."""
    from analytics import pricing  # noqa: PLC0415

    table = pricing.PriceTable.load(prices, data_dir=data_dir)
    seen: set[str] = set()  # a stored object is billed once (its first creator)
    # the events usage_lines reads (the rest, half a loop's events, have none: skipped without a call)
    names = {"task.done", *pricing._TERMINAL, *pricing._REF_EVENTS}

    def price(ev: Event) -> float:
        if ev.name not in names:
            return 0.0
        return pricing.event_cost(table, ev.name, ev.data, ev.timestamp, seen).total

    return price, table.currency


def layout(graph: dict[str, Any]) -> dict[str, list[float]]:
    """Node positions: networkx's multipartite layout over the layers of the condensation (a
    cycle's steps share a layer, joins sit after all their inputs)."""
    import networkx as nx  # noqa: PLC0415

    g = nx.DiGraph()
    g.add_nodes_from(graph["steps"])
    g.add_edges_from((e["from"], e["to"]) for e in graph["edges"])
    if not g:
        return {}
    cond = nx.condensation(g)
    for layer, comps in enumerate(nx.topological_generations(cond)):
        for c in comps:
            for i, n in enumerate(sorted(cond.nodes[c]["members"], key=graph["steps"].index)):
                g.nodes[n]["layer"] = 2 * layer + (i % 2)  # a cycle's steps side by side, not on top
    pos = nx.multipartite_layout(g, subset_key="layer", align="vertical", scale=1.0)
    return {n: [round(float(x), 4), round(float(y), 4)] for n, (x, y) in pos.items()}


def _check_id(execution_id: str) -> str:
    if not execution_id or len(execution_id) > MAX_ID or any(ord(c) < 32 for c in execution_id):
        raise ValueError(f"not an execution id: {execution_id[:MAX_ID]!r}")
    return execution_id


class DiskCache:
    """Explanations kept across processes (``<data dir>/explain_cache.db``): a big execution is
    folded once, by whoever opens it first (the page or ``noetl-dagster explain``); an entry is
    used only while the log has nothing after its last sequence. Derived data: deleting the
    file loses nothing."""

    def __init__(self, path: str | Path):
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("CREATE TABLE IF NOT EXISTS explain_cache (execution_id TEXT PRIMARY KEY, "
                         "last_sequence INTEGER NOT NULL, body BLOB NOT NULL)")  # fmt: skip
        self._lock = threading.Lock()

    def get(self, execution_id: str) -> tuple[int, Explanation] | None:
        with self._lock:
            row = self._db.execute("SELECT last_sequence, body FROM explain_cache WHERE execution_id = ?",
                                   (execution_id,)).fetchone()  # fmt: skip
        if row is None:
            return None
        try:
            return int(row[0]), Explanation.load(zstandard.ZstdDecompressor().decompress(row[1]))
        except Exception:  # noqa: BLE001 - a damaged entry: fold again
            return None

    def put(self, execution_id: str, last: int, exp: Explanation) -> None:
        body = zstandard.ZstdCompressor(level=3).compress(exp.dump())
        with self._lock:
            self._db.execute("INSERT OR REPLACE INTO explain_cache VALUES (?, ?, ?)", (execution_id, last, body))


def default_cache(data_dir: str | None = None) -> DiskCache:
    import os  # noqa: PLC0415

    return DiskCache(Path(data_dir or os.environ.get("NOETL_DAGSTER_HOME") or ".noetl") / "explain_cache.db")


class _Entry:
    """One execution as the server knows it: the fold (resumable when it was built here from the
    first event), the page built from it (None: fed since, build again), the last sequence folded."""

    __slots__ = ("last", "page", "exp", "folder")

    def __init__(self, last: int, page: dict[str, Any] | None, exp: Explanation | None, folder: Explainer | None):
        self.last, self.page, self.exp, self.folder = last, page, exp, folder

    def owner(self) -> tuple[str | None, str | None]:
        ex = self.page["execution"] if self.page is not None else (self.folder.ex if self.folder else {})
        return ex.get("tenant"), ex.get("project")


class ExecutionViews:
    """Explanations and diffs over one event store; ``scope`` None: the local operator (CLI).

    An execution is folded once: later requests feed only the events appended since (or read
    the disk cache), and :meth:`follow` (a server's background thread) folds executions as their
    events are appended, so even a 200,000-iteration loop's page opens from memory."""

    def __init__(self, event_store: Any, *, prices: str | None = None, data_dir: str | None = None,
                 cache: DiskCache | None = None):  # fmt: skip
        self.store = event_store
        self.disk = cache
        self._prices, self._data_dir = prices, data_dir
        self.currency = ""
        self._cache: OrderedDict[str, _Entry] = OrderedDict()
        self._lock = threading.RLock()  # folding and building pages: one at a time (the follower too)
        self.cursor: int | None = None  # the follower's position in the store (gid); None: not started

    def _pricing(self) -> Any:
        price, self.currency = pricer(self._prices, self._data_dir)  # per fold: its own `seen` set
        return price

    def _read(self, execution_id: str, scope: TenantScope | None, after: int = 0) -> list[Event]:
        evs = self.store.read(_check_id(execution_id), after)
        if not evs and not after:
            if scope is not None:  # the same answer as for another tenant's execution
                scope.execution(execution_id, None, None)
            raise UnknownExecution(f"no events for execution {execution_id}")
        if scope is not None and evs:
            scope.execution(execution_id, evs[0].tenant_id, evs[0].project_id)
        return evs

    def explained(self, execution_id: str, scope: TenantScope | None = None) -> tuple[dict[str, Any], Explanation]:
        _check_id(execution_id)
        with self._lock:
            e = self._cache.get(execution_id)
            if e is None and self.disk is not None and (got := self.disk.get(execution_id)) is not None:
                e = _Entry(got[0], got[1].data, got[1], None)
            if e is not None:
                if scope is not None:
                    scope.execution(execution_id, *e.owner())
                new = self.store.read(execution_id, e.last)
                if new and e.folder is not None and new[0].sequence == e.last + 1:
                    e.folder.feed(new)  # only what was appended since
                    e.last, e.page = e.folder.ex["last_sequence"], None
                elif new:
                    e = None  # cached without its fold (the disk cache): fold again
            if e is None:
                evs = self._read(execution_id, scope)
                folder = Explainer(price=self._pricing()).feed(evs)
                e = _Entry(folder.ex["last_sequence"], None, None, folder)
            if e.page is None or e.exp is None:
                self._build(execution_id, e)
            self._remember(execution_id, e)
            assert e.page is not None and e.exp is not None
            return e.page, e.exp

    def _build(self, execution_id: str, e: _Entry) -> None:
        assert e.folder is not None
        pb, why = playbook_of([e.folder.request] if e.folder.request is not None else [])
        e.folder.lines = step_lines(pb)
        exp = e.folder.result()
        page = exp.data  # the page's additions go into the explanation, so a cache keeps them
        page["graph"] = playbook_graph(pb, page["arcs"])
        page["graph"]["positions"] = layout(page["graph"])
        page["playbook_missing"] = why
        page["currency"] = self.currency
        e.page, e.exp = page, exp
        if self.disk is not None and page["execution"]["status"] in ("completed", "failed"):
            self.disk.put(execution_id, e.last, exp)

    def _remember(self, execution_id: str, e: _Entry) -> None:
        self._cache[execution_id] = e
        self._cache.move_to_end(execution_id)
        while len(self._cache) > CACHE:
            self._cache.popitem(last=False)

    def follow_once(self, limit: int = 5000) -> int:
        """Fold the events appended since the last call (executions seen from their first event);
        the number of events read. The first call starts at the end of the log."""
        if self.cursor is None:
            self.cursor = self.store.tail_last()
            return 0
        batch = self.store.tail(self.cursor, limit)
        if not batch:
            return 0
        self.cursor = batch[-1].gid
        by: dict[str, list[Event]] = {}
        for se in batch:
            by.setdefault(se.event.execution_id, []).append(se.event)
        with self._lock:
            for eid, evs in by.items():
                e = self._cache.get(eid)
                if e is None and evs[0].sequence == 1:  # a new execution: followed from its start
                    e = _Entry(0, None, None, Explainer(price=self._pricing()))
                    self._remember(eid, e)
                if e is None or e.folder is None or evs[0].sequence != e.last + 1:
                    continue  # not followed from its start: folded when opened
                e.folder.feed(evs)
                e.last, e.page, e.exp = e.folder.ex["last_sequence"], None, None
        return len(batch)

    def follow(self, stop: threading.Event, interval: float = 0.5) -> None:
        """:meth:`follow_once` until ``stop`` is set (a server's background thread)."""
        while not stop.is_set():
            try:
                n = self.follow_once()
            except Exception:  # noqa: BLE001 - a bad batch: pages fold from the log when opened
                n = 0
            if not n:
                stop.wait(interval)

    def warm(self, limit: int = 20) -> int:
        """Fold the ``limit`` most recent finished executions not cached yet (a server does this in
        the background at start, so a big execution's first open reads the cache); the count folded."""
        n = 0
        for info in self.store.executions(limit):
            if info.status in ("completed", "failed") and (self.disk is None or self.disk.get(info.execution_id) is None):
                try:
                    self.explained(info.execution_id)
                    n += 1
                except Exception:  # noqa: BLE001 - a bad log is explained (or refused) when opened
                    continue
        return n

    def explain(self, execution_id: str, scope: TenantScope | None = None) -> dict[str, Any]:
        return self.explained(execution_id, scope)[0]

    def iterations(self, execution_id: str, step_run_id: str, offset: int, limit: int,
                   scope: TenantScope | None = None) -> dict[str, Any]:  # fmt: skip
        return self.explained(execution_id, scope)[1].iterations(step_run_id, offset, limit)

    def diff(self, a: str, b: str, scope: TenantScope | None = None) -> dict[str, Any]:
        ea, eb = self._read(a, scope), self._read(b, scope)
        pa, _ = playbook_of(ea)
        pb, _ = playbook_of(eb)
        when = {s.name: [None if arc.when is None else str(arc.when) for arc in (s.next.arcs if s.next else ())]
                for s in (pa or pb).workflow} if (pa or pb) else None  # fmt: skip
        out = diff_events(ea, eb, when=when, changed=changed_steps(pa, pb))
        out["lines"] = {"a": step_lines(pa), "b": step_lines(pb)}
        return out
