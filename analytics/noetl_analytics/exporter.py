"""Tail an EventStore from a stored cursor and export its events as facts.

The cursor (the EventStore's global ``gid``) is stored in the facts database
itself (``export_cursor``), after each batch's facts are inserted and the
priced table rebuilt for the days the batch touched. A crash anywhere before
the cursor update, or a lost cursor, makes the next run re-send events; the
fact tables collapse re-sent rows on ``event_id`` (every reader uses
``FINAL``) and the rollups are recomputed from the deduplicated facts, never
summed from inserts, so no total changes. Run one exporter per facts store
(chdb allows one process per path anyway).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from noetl_analytics.facts import FACT_TABLES, FactWriter
from noetl_analytics.pricing import PriceTable, utc_day
from noetl_analytics.rollups import build_days, ensure_prices, loaded_prices
from noetl_analytics.store import FactsStore
from noetl_dagster.storage.events import EventStore


@dataclass
class ExportReport:
    source: str
    cursor_before: int
    cursor_after: int
    events: int = 0
    rows: dict[str, int] = field(default_factory=lambda: dict.fromkeys(FACT_TABLES, 0))
    lag_events: int = 0  # events in the log not exported yet
    lag_seconds: float = 0.0  # age of the oldest event not exported yet
    seconds: float = 0.0

    @property
    def events_per_second(self) -> float:
        return self.events / self.seconds if self.seconds > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "cursor_before": self.cursor_before,
            "cursor_after": self.cursor_after,
            "events": self.events,
            "rows": dict(self.rows),
            "lag_events": self.lag_events,
            "lag_seconds": round(self.lag_seconds, 3),
            "seconds": round(self.seconds, 3),
        }


def _age_seconds(timestamp: str) -> float:
    try:
        then = datetime.fromisoformat(timestamp)
    except ValueError:
        return 0.0
    if then.tzinfo is None:
        then = then.replace(tzinfo=UTC)
    return max(0.0, (datetime.now(UTC) - then).total_seconds())


class FactExporter:
    def __init__(
        self,
        facts: FactsStore,
        events: EventStore,
        *,
        batch_events: int = 20_000,
        source: str | None = None,
        prices: PriceTable | None = None,
    ):
        if batch_events <= 0:
            raise ValueError("batch_events must be positive")
        self.facts = facts
        self.events = events
        self.batch_events = batch_events
        self.source = source or events.url
        self.writer = FactWriter(facts, batch_events=batch_events)
        self.prices = prices  # loaded when the store has no price table yet

    def cursor(self) -> int:
        value = self.facts.scalar(
            "SELECT argMax(cursor, updated_at) FROM $db.export_cursor WHERE source = {source:String}",
            {"source": self.source},
        )
        return int(value or 0)

    def save_cursor(self, value: int) -> None:
        self.facts.insert_rows(
            "export_cursor",
            [[self.source, int(value), datetime.now(UTC)]],
            ["source", "cursor", "updated_at"],
        )

    def lag(self, cursor: int | None = None) -> tuple[int, float]:
        """(events not exported yet, age in seconds of the oldest of them)."""
        cursor = self.cursor() if cursor is None else cursor
        last = self.events.tail_last()
        if last <= cursor:
            return 0, 0.0
        first = self.events.tail(cursor, 1)
        # gids may have holes (rolled-back appends): count what is actually there
        behind = last - cursor
        return behind, _age_seconds(first[0].event.timestamp) if first else 0.0

    def export(self, max_events: int | None = None) -> ExportReport:
        """Export events after the stored cursor (at most ``max_events``)."""
        started = time.perf_counter()
        cursor = self.cursor()
        report = ExportReport(self.source, cursor, cursor)
        ensure_prices(self.facts, self.prices)
        prices = loaded_prices(self.facts, self.prices)
        while max_events is None or report.events < max_events:
            limit = (
                self.batch_events
                if max_events is None
                else min(self.batch_events, max_events - report.events)
            )
            batch = self.events.tail(cursor, limit)
            if not batch:
                break
            counts = self.writer.write_batch([stored.event for stored in batch])
            for table, n in counts.items():
                report.rows[table] += n
            # the rollups of the batch's days, from the deduplicated facts, before the cursor moves
            build_days(self.facts, prices, {utc_day(stored.event.timestamp) for stored in batch})
            cursor = batch[-1].gid
            self.save_cursor(cursor)
            report.events += len(batch)
            report.cursor_after = cursor
        report.lag_events, report.lag_seconds = self.lag(cursor)
        report.seconds = time.perf_counter() - started
        return report
