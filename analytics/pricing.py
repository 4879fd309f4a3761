"""The configurable price table for tenant-cost showback.

A YAML (or JSON) mapping with sections ``compute`` (per CPU-second by worker
class), ``storage`` (per GB-month by storage class) with ``storage_months``,
``egress`` (per GB by region), ``call`` (per call by tool kind), ``quantum``
(per ``shot`` and per ``qpu_second``),
``worker_class_by_kind`` and ``currency``. See ``analytics/prices.yaml``.

The cost of one execution (:class:`AttemptUsage`, :class:`Cost`,
:meth:`PriceTable.attempt_cost`) is the allocation SQL's formula
(``sql/V003__allocation.sql``, ``V004__quantum_prices.sql``) in Python, priced by
the same ``allocation:`` version, so Dagster metadata and the ClickHouse rollups agree.
"""

from __future__ import annotations

import os
from collections.abc import Container, Iterable
from dataclasses import dataclass, field
from datetime import UTC, date, datetime
from pathlib import Path
from typing import Any

DEFAULT_PRICES = Path(__file__).parent / "prices.yaml"
UNITS = {"compute": "cpu_second", "storage": "GB-month", "egress": "GB", "call": "call", "quantum": "item"}
QUANTUM_ITEMS = ("shot", "qpu_second")  # the quantum section's items are its units
_KEYS = set(UNITS) | {"currency", "storage_months", "worker_class_by_kind", "allocation"}
# one version of the allocation prices (OpenCost's units); `version` and `valid_from` name it
ALLOCATION_PRICES = (
    "cpu_core_hour",
    "ram_gb_hour",
    "egress_gb",
    "storage_gb_hour",
    "capacity_cores",
    "capacity_ram_gb",
    "shot",  # quantum line (sql/V004__quantum_prices.sql): per shot and per QPU-second
    "qpu_second",
)


class PriceConfigError(ValueError):
    pass


@dataclass(frozen=True)
class PriceTable:
    currency: str = "USD"
    prices: dict[str, dict[str, float]] = field(default_factory=dict)
    storage_months: float = 1.0
    worker_class_by_kind: dict[str, str] = field(default_factory=dict)
    source: str = "<inline>"
    allocation: tuple[dict[str, Any], ...] = ()

    @classmethod
    def from_dict(cls, raw: Any, source: str = "<inline>") -> PriceTable:
        if not isinstance(raw, dict):
            raise PriceConfigError(f"{source}: the price table must be a mapping")
        unknown = set(raw) - _KEYS
        if unknown:
            raise PriceConfigError(
                f"{source}: unknown price sections {sorted(unknown)} (known: {sorted(_KEYS)})"
            )
        prices: dict[str, dict[str, float]] = {}
        for category in UNITS:
            section = raw.get(category) or {}
            if not isinstance(section, dict):
                raise PriceConfigError(f"{source}: `{category}` must map items to prices")
            prices[category] = {}
            if category == "quantum" and set(map(str, section)) - set(QUANTUM_ITEMS):
                raise PriceConfigError(
                    f"{source}: quantum prices are per {' and per '.join(QUANTUM_ITEMS)},"
                    f" got {sorted(set(map(str, section)) - set(QUANTUM_ITEMS))}"
                )
            for item, price in section.items():
                if isinstance(price, bool) or not isinstance(price, (int, float)) or price < 0:
                    raise PriceConfigError(
                        f"{source}: {category}.{item} must be a non-negative number, got {price!r}"
                    )
                prices[category][str(item)] = float(price)
        months = raw.get("storage_months", 1)
        if isinstance(months, bool) or not isinstance(months, (int, float)) or months < 0:
            raise PriceConfigError(f"{source}: storage_months must be a non-negative number, got {months!r}")
        mapping = raw.get("worker_class_by_kind") or {}
        if not isinstance(mapping, dict) or not all(isinstance(v, str) for v in mapping.values()):
            raise PriceConfigError(
                f"{source}: worker_class_by_kind must map tool kinds to worker class names"
            )
        currency = raw.get("currency", "USD")
        if not isinstance(currency, str) or not currency:
            raise PriceConfigError(f"{source}: currency must be a non-empty string")
        allocation = _allocation_versions(raw.get("allocation"), source)
        return cls(
            currency, prices, float(months), {str(k): v for k, v in mapping.items()}, source, allocation
        )

    @classmethod
    def load(
        cls, path: str | os.PathLike[str] | None = None, *, data_dir: str | os.PathLike[str] | None = None
    ) -> PriceTable:
        """``path`` > ``$NOETL_DAGSTER_PRICES`` > ``<data dir>/prices.yaml`` > the packaged default."""
        candidates = [path, os.environ.get("NOETL_DAGSTER_PRICES")]
        base = data_dir or os.environ.get("NOETL_DAGSTER_HOME") or ".noetl"
        candidates.append(Path(base) / "prices.yaml")
        for candidate in candidates:
            if not candidate:
                continue
            p = Path(candidate)
            if p.exists():  # the reader refuses what is not a regular file (a FIFO, a device)
                return cls._read(p)
            if candidate is path or candidate == os.environ.get("NOETL_DAGSTER_PRICES"):
                raise PriceConfigError(f"price table not found: {p}")
        return cls._read(DEFAULT_PRICES)

    @classmethod
    def _read(cls, path: Path) -> PriceTable:
        from noetl_dagster.dsl.loader import YamlFileError, YamlSyntaxError, load_yaml_file  # noqa: PLC0415

        try:  # the bounded reader and the YAML limits every command uses
            raw, _ = load_yaml_file(path, what="price table")
        except YamlFileError as e:  # not a regular file (a FIFO, a device), unreadable
            raise PriceConfigError(str(e)) from None
        except YamlSyntaxError as e:
            raise PriceConfigError(f"the price table is not valid YAML/JSON: {e}") from None
        return cls.from_dict(raw, str(path))

    def version_on(self, day: date) -> dict[str, Any] | None:
        """The allocation version that prices ``day``: the latest ``valid_from`` on or before it
        (the SQL's ``ASOF JOIN ... day >= valid_from``); None before the first one (costs nothing)."""
        best = None
        for v in self.allocation:
            if v["valid_from"] <= day and (
                best is None or (v["valid_from"], v["version"]) > (best["valid_from"], best["version"])
            ):
                best = v
        return best

    def attempt_cost(self, usage: AttemptUsage) -> Cost:
        """One attempt priced like ``allocation_cost_day``: CPU core-hours x core-hour price, RAM
        byte-hours / 1e9 x GB-hour price, egress bytes / 1e9 x GB price, shots x shot price and
        QPU seconds x QPU-second price, by the version valid on the attempt's (UTC) day."""
        v = self.version_on(usage.day)
        if v is None:
            return Cost.of(usage, currency=self.currency)
        return Cost.of(
            usage,
            cpu=usage.cpu_core_hours * v["cpu_core_hour"],
            ram=usage.ram_byte_hours / 1e9 * v["ram_gb_hour"],
            egress=usage.egress_bytes / 1e9 * v["egress_gb"],
            shot=usage.shots * v["shot"],
            qpu=usage.qpu_seconds * v["qpu_second"],
            currency=self.currency,
            version=v["version"],
        )

    def cost(self, attempts: Iterable[AttemptUsage]) -> Cost:
        """The summed cost of several attempts (a step, an op, an execution)."""
        total = Cost(currency=self.currency)
        for a in attempts:
            total = total + self.attempt_cost(a)
        return total

    def rows(self) -> list[list[Any]]:
        """Rows for the ``price`` table: category, item, unit, price, multiplier, currency."""
        out = []
        for category, items in self.prices.items():
            multiplier = self.storage_months if category == "storage" else 1.0
            for item, price in sorted(items.items()):
                unit = item if category == "quantum" else UNITS[category]
                out.append([category, item, unit, price, multiplier, self.currency])
        return out


def _allocation_versions(raw: Any, source: str) -> tuple[dict[str, Any], ...]:
    """``allocation:`` is one version (a mapping) or a list of versions, each priced from its ``valid_from``."""
    if raw is None:
        return ()
    versions = raw if isinstance(raw, list) else [raw]
    out = []
    for i, v in enumerate(versions):
        where = f"{source}: allocation[{i}]"
        if not isinstance(v, dict):
            raise PriceConfigError(f"{where} must be a mapping")
        unknown = set(v) - set(ALLOCATION_PRICES) - {"version", "valid_from"}
        if unknown:
            raise PriceConfigError(
                f"{where}: unknown keys {sorted(unknown)} (known: version, valid_from, {', '.join(ALLOCATION_PRICES)})"
            )
        row: dict[str, Any] = {"version": str(v.get("version") or f"v{i + 1}")}
        try:
            row["valid_from"] = date.fromisoformat(str(v.get("valid_from") or "1970-01-01"))
        except ValueError:
            raise PriceConfigError(
                f"{where}: valid_from must be a date (YYYY-MM-DD), got {v.get('valid_from')!r}"
            ) from None
        for k in ALLOCATION_PRICES:
            x = v.get(k, 0)
            if isinstance(x, bool) or not isinstance(x, (int, float)) or x < 0:
                raise PriceConfigError(f"{where}: {k} must be a non-negative number, got {x!r}")
            row[k] = float(x)
        out.append(row)
    return tuple(out)


# -- the cost of an execution: sql/V003__allocation.sql's formula, per attempt -------------------
def _number(value: Any) -> float | None:
    """A value as the facts writer stores a Float64 (analytics/facts.py ``_as_number``)."""
    if value is None:
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def _count(value: Any) -> int:
    """A value as the facts writer stores a UInt64 (``_as_count``; NULL becomes the default 0)."""
    n = _number(value)
    return int(n) if n is not None and n >= 0 and n == n else 0


def _dict(value: Any) -> dict[str, Any]:
    return value if type(value) is dict else {}


@dataclass(frozen=True)
class AttemptUsage:
    """One task attempt's allocation quantities, derived from its ``task.done`` outcome the way the
    facts writer fills ``task_fact`` (analytics/facts.py ``_task``) and ``allocation_step_day_mv`` sums it:

    - ``cpu_core_hours`` = ``coalesce(cpu_ms, duration_ms * units) / 3.6e6``, ``cpu_ms`` =
      ``meta.cpu_ms``, else (``usage.cpu_s`` + ``usage.child_cpu_s``) x 1000;
    - ``ram_byte_hours`` = ``usage.mem_delta_bytes`` x ``meta.duration_ms`` / 3.6e6;
    - ``egress_bytes`` = ``meta.egress_bytes``, else ``usage.egress_bytes``, else ``http.request_bytes``;
    - ``shots`` = ``usage.shots``, ``qpu_seconds`` = ``usage.qpu_s``;
    - ``day`` = the UTC date of the event (``toDate(ts)``), which picks the price version.
    """

    day: date
    cpu_core_hours: float = 0.0
    ram_byte_hours: float = 0.0
    egress_bytes: int = 0
    shots: int = 0
    qpu_seconds: float = 0.0

    @classmethod
    def from_outcome(cls, outcome: Any, timestamp: Any) -> AttemptUsage:
        outcome = _dict(outcome)
        meta = _dict(outcome.get("meta"))
        usage = _dict(meta.get("usage"))
        duration = _number(meta.get("duration_ms")) or 0.0
        cpu_ms = _number(meta.get("cpu_ms"))
        if cpu_ms is None and "cpu_s" in usage:
            cpu_ms = ((usage.get("cpu_s") or 0) + (usage.get("child_cpu_s") or 0)) * 1000
        if cpu_ms is None:  # recorded before usage was measured: runtime x units
            units = _number(meta.get("units"))
            cpu_ms = duration * (1.0 if units is None else units)
        egress = meta.get("egress_bytes")
        if egress is None:
            egress = usage.get("egress_bytes")
        if egress is None:
            egress = _dict(outcome.get("http")).get("request_bytes")
        return cls(
            day=_utc_day(timestamp),
            cpu_core_hours=cpu_ms / 3.6e6,
            ram_byte_hours=_count(usage.get("mem_delta_bytes")) * duration / 3.6e6,
            egress_bytes=_count(egress),
            shots=_count(usage.get("shots")),
            qpu_seconds=_number(usage.get("qpu_s")) or 0.0,
        )

    @classmethod
    def from_task_done(cls, data: Any, timestamp: Any) -> AttemptUsage:
        """From a ``task.done`` event's ``data`` and ``timestamp``."""
        return cls.from_outcome(_dict(data).get("outcome"), timestamp)


def _utc_day(timestamp: Any) -> date:
    if isinstance(timestamp, datetime):
        ts = timestamp
    else:
        try:
            ts = datetime.fromisoformat(str(timestamp))
        except ValueError:
            ts = datetime.now(UTC)
    if ts.tzinfo is None:
        ts = ts.replace(tzinfo=UTC)
    return ts.astimezone(UTC).date()


COST_COMPONENTS = ("cpu", "ram", "egress", "shot", "qpu")


@dataclass(frozen=True)
class Cost:
    """Priced usage of one or more attempts, by component (the SQL's ``cpu_cost``, ``ram_cost``,
    ``egress_cost``, ``shot_cost``, ``qpu_cost``), with the quantities and the price versions used."""

    cpu: float = 0.0
    ram: float = 0.0
    egress: float = 0.0
    shot: float = 0.0
    qpu: float = 0.0
    currency: str = "USD"
    versions: tuple[str, ...] = ()
    attempts: int = 0
    cpu_core_hours: float = 0.0
    ram_byte_hours: float = 0.0
    egress_bytes: int = 0
    shots: int = 0
    qpu_seconds: float = 0.0

    @classmethod
    def of(cls, usage: AttemptUsage, *, currency: str, version: str | None = None, **amounts: float) -> Cost:
        return cls(
            **amounts, currency=currency, versions=(version,) if version else (), attempts=1,
            cpu_core_hours=usage.cpu_core_hours, ram_byte_hours=usage.ram_byte_hours,
            egress_bytes=usage.egress_bytes, shots=usage.shots, qpu_seconds=usage.qpu_seconds,
        )  # fmt: skip

    @property
    def quantum(self) -> float:
        return self.shot + self.qpu

    @property
    def total(self) -> float:
        """``cost`` of ``allocation_cost_day``: compute + RAM + egress + quantum."""
        return self.cpu + self.ram + self.egress + self.quantum

    @property
    def price_version(self) -> str:
        """The version(s) that priced it, comma-separated ("" when none applied)."""
        return ",".join(self.versions)

    def __add__(self, other: Cost) -> Cost:
        if not isinstance(other, Cost):
            return NotImplemented
        return Cost(
            *(getattr(self, c) + getattr(other, c) for c in COST_COMPONENTS),
            currency=self.currency,
            versions=tuple(sorted(set(self.versions) | set(other.versions))),
            attempts=self.attempts + other.attempts,
            cpu_core_hours=self.cpu_core_hours + other.cpu_core_hours,
            ram_byte_hours=self.ram_byte_hours + other.ram_byte_hours,
            egress_bytes=self.egress_bytes + other.egress_bytes,
            shots=self.shots + other.shots,
            qpu_seconds=self.qpu_seconds + other.qpu_seconds,
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"total": self.total, **{c: getattr(self, c) for c in COST_COMPONENTS}}
        out.update(currency=self.currency, price_version=self.price_version, attempts=self.attempts)
        return out


def cost_of_events(
    prices: PriceTable, events: Iterable[Any], step_runs: Container[str] | None = None
) -> dict[str, Cost]:
    """Cost per step of the ``task.done`` events (objects with ``name``, ``step``, ``step_run_id``,
    ``data``, ``timestamp``), every attempt counted (failed ones too, as ``task_fact`` does);
    ``step_runs``, when given, keeps only the events of those step runs."""
    out: dict[str, Cost] = {}
    for ev in events:
        if ev.name != "task.done" or (step_runs is not None and ev.step_run_id not in step_runs):
            continue
        c = prices.attempt_cost(AttemptUsage.from_task_done(ev.data, ev.timestamp))
        step = ev.step or ""
        out[step] = out[step] + c if step in out else c
    return out
