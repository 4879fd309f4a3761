"""Explain and diff of executions for the CLI and the dashboard's execution pages (issue 36).

The engine folds the events (``engine/explain.py``, ``engine/execution_diff.py``); this adds
what lives above it: the price table (a step run's measured cost), the playbook's graph laid
out by networkx (layers of the condensation: a cycle's steps share a column; imported when a
server starts, not at a page's first open). A page reads the
execution's summary the event store keeps beside the log (``engine/explain_summary.py``) and
the events after it, never the whole log of an execution that has one; a big loop's iterations
page from the stretch of the log that holds them. Every read on behalf of a dashboard viewer
passes :meth:`TenantScope.execution` first.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from datetime import date, timedelta
from typing import Any

from noetl_analytics.dashboard_access import TenantScope
from noetl_dagster.engine.error_location import error_line
from noetl_dagster.engine.events import Event
from noetl_dagster.engine.execution_diff import diff as diff_events
from noetl_dagster.engine.explain import Explainer, Explanation, UnknownExecution
from noetl_dagster.engine.explain_playbook import changed_steps, playbook_graph, playbook_of, step_lines
from noetl_dagster.engine.explain_summary import rebuild, restore, state_rows
from noetl_dagster.util.links import dagster_links

MAX_ID = 100
CACHE = 64  # pages kept by a server (a 200,000-iteration loop's: ~20 KB)
_EPOCH = date(1970, 1, 1)  # a ledger's day is days since


def pricer(prices: str | None = None, data_dir: str | None = None) -> tuple[Any, str]:
    """(the cost of a step run's ledger, currency) from the configured price table: the same lines
    and prices as the facts and Dagster's cost metadata (a ledger sums the usage lines of
    ``engine/usage_lines.py`` by category, item, kind and day; a price is linear in its quantity)."""
    from noetl_analytics import pricing  # noqa: PLC0415

    table = pricing.PriceTable.load(prices, data_dir=data_dir)
    memo: dict[str, float] = {}  # a ledger key -> its unit price

    def price(ledger: dict[str, float]) -> float:
        total = 0.0
        for key, q in ledger.items():
            unit = memo.get(key)
            if unit is None:
                cat, item, kind, day = key.split("\t")
                line = pricing.UsageLine(cat, item, 1.0, kind=kind)
                unit = memo[key] = table.line_cost(line, _EPOCH + timedelta(days=int(day)))[0]
            total += unit * q
        return total

    return price, table.currency


def layout(graph: dict[str, Any]) -> dict[str, list[float]]:
    """Node positions: networkx's multipartite layout over the layers of the condensation (a
    cycle's steps share a layer, joins sit after all their inputs). A server imports networkx
    when it starts (:func:`preload_layout`), so a page's first open does not pay the import."""
    import networkx as nx  # noqa: PLC0415

    g = nx.DiGraph()
    g.add_nodes_from(graph["steps"])
    g.add_edges_from((e["from"], e["to"]) for e in graph["edges"])
    if not g:
        return {}
    cond = nx.condensation(g)
    order = {n: i for i, n in enumerate(graph["steps"])}
    for layer, comps in enumerate(nx.topological_generations(cond)):
        for c in comps:
            for i, n in enumerate(sorted(cond.nodes[c]["members"], key=lambda n: order.get(n, len(order)))):
                g.nodes[n]["layer"] = 2 * layer + (i % 2)  # a cycle's steps side by side, not on top
    pos = nx.multipartite_layout(g, subset_key="layer", align="vertical", scale=1.0)
    return {n: [round(float(x), 4), round(float(y), 4)] for n, (x, y) in pos.items()}


def preload_layout() -> None:
    """Import networkx and numpy (its layouts use it) by laying out a small graph with a cycle:
    ~0.5-1.7 s on a loaded machine, paid by a server as it starts (``make_server``), not by the
    first page; the CLI pays it at its one layout."""
    layout({"steps": ["a", "b", "c"], "edges": [{"from": "a", "to": "b"}, {"from": "b", "to": "c"},
                                                {"from": "c", "to": "b"}]})  # fmt: skip


def _check_id(execution_id: str) -> str:
    if not execution_id or len(execution_id) > MAX_ID or any(ord(c) < 32 for c in execution_id):
        raise ValueError(f"not an execution id: {execution_id[:MAX_ID]!r}")
    return execution_id


class ExecutionViews:
    """Explanations and diffs over one event store; ``scope`` None: the local operator (CLI).

    A page reads the execution's summary (kept by the store with each append), folds the events
    after it (none, once the execution stopped) and prices the ledgers; an execution without a
    summary (recorded before summaries) is folded once from its log and its summary written
    back. Pages built are kept in memory by last sequence; ``reads`` counts the events read."""

    def __init__(self, event_store: Any, *, prices: str | None = None, data_dir: str | None = None):
        self.store = event_store
        self._prices, self._data_dir = prices, data_dir
        self.currency = ""
        self._price: Any = None
        self._cache: OrderedDict[str, tuple[int, dict[str, Any], Explanation]] = OrderedDict()
        self._lock = threading.RLock()
        self.reads = 0  # events read from the log (a test counts them: a page must not read them all)
        self.rebuilt = 0  # summaries folded from the whole log

    def _pricing(self) -> Any:
        if self._price is None:
            self._price, self.currency = pricer(self._prices, self._data_dir)
        return self._price

    def _read(self, execution_id: str, scope: TenantScope | None, after: int = 0) -> list[Event]:
        evs = self.store.read(_check_id(execution_id), after)
        self.reads += len(evs)
        if not evs and not after:
            if scope is not None:  # the same answer as for another tenant's execution
                scope.execution(execution_id, None, None)
            raise UnknownExecution(f"no events for execution {execution_id}")
        if scope is not None and evs:
            scope.execution(execution_id, evs[0].tenant_id, evs[0].project_id)
        return evs

    def explained(
        self, execution_id: str, scope: TenantScope | None = None
    ) -> tuple[dict[str, Any], Explanation]:
        _check_id(execution_id)
        with self._lock:
            got = self.store.summary(execution_id)
            hit = self._cache.get(execution_id)
            if got is not None and hit is not None and hit[0] == got[0]:
                ex = hit[1]["execution"]
                if scope is not None:
                    scope.execution(execution_id, ex.get("tenant"), ex.get("project"))
                if not self._tail(execution_id, got[0]):
                    self._cache.move_to_end(execution_id)
                    return hit[1], hit[2]
            folder = restore(got[1]) if got is not None else None
            after = got[0] if folder is not None and got is not None else None
            if folder is None:  # no summary (recorded before them): the whole log, once
                folder = rebuild(self._read(execution_id, scope))
                self.rebuilt += 1
            else:
                if scope is not None:
                    scope.execution(execution_id, folder.ex.get("tenant"), folder.ex.get("project"))
                folder.feed(self._tail(execution_id, after or 0))
            last = folder.ex["last_sequence"]
            if last != after:  # folded here: kept for the next open (unless a writer moved it meanwhile)
                try:
                    stored = got[0] if got is not None else None  # (one restore refused is replaced)
                    self.store.put_summary(execution_id, stored, last, state_rows(folder, everything=True))
                except Exception:  # noqa: BLE001 - a read-only store: fold again next time
                    pass
            page, exp = self._build(execution_id, folder)
            self._cache[execution_id] = (last, page, exp)
            self._cache.move_to_end(execution_id)
            while len(self._cache) > CACHE:
                self._cache.popitem(last=False)
            return page, exp

    def _tail(self, execution_id: str, after: int) -> list[Event]:
        evs = self.store.read(execution_id, after)
        self.reads += len(evs)
        return evs

    def _range(self, execution_id: str) -> Any:
        def read_range(after: int, until: int) -> list[Event]:
            evs = self.store.read_range(execution_id, after, until)
            self.reads += len(evs)
            return evs

        return read_range

    def _build(self, execution_id: str, folder: Explainer) -> tuple[dict[str, Any], Explanation]:
        request = folder.request
        seq = folder.ex.get("request_sequence")
        if request is None and isinstance(seq, int):
            request = next(iter(self._range(execution_id)(seq - 1, seq)), None)
        pb, why = playbook_of([request] if request is not None else [])
        folder.lines, folder.playbook = step_lines(pb), pb
        exp = folder.result(self._pricing(), self._range(execution_id))
        page = exp.data
        page["graph"] = playbook_graph(pb, page["arcs"])
        page["graph"]["positions"] = layout(page["graph"])
        page["playbook_missing"] = why
        page["dagster"] = dagster_links(
            execution_id, page["execution"].get("requested_by")
        )  # back to its runs
        page["currency"] = self.currency
        return page, exp

    def warm(self, limit: int = 20) -> int:
        """Write the summaries of the ``limit`` most recent executions that have none (recorded
        before summaries) or one this version cannot restore (written before its billed stored
        references were kept), so their first open reads no log; the count folded."""
        n = 0
        for info in self.store.executions(limit):
            got = self.store.summary(info.execution_id)
            if got is None or restore(got[1]) is None:
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
        f = out["first"]
        for side, p in (
            (("a", pa), ("b", pb)) if f else ()
        ):  # each side's error: one rule with Dagster, explain
            at = f.get(f"{side}_error_at")
            f[f"{side}_error_line"] = error_line(p, f["step"], *at) if at else None
        return out
