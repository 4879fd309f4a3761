"""The one versioned price table, and the usage lines it prices.

Every cost the suite shows comes from here: the facts writer stores the usage
lines of each event (:func:`usage_lines`) in ``usage_fact``; the priced table
``cost_line_day`` multiplies them by the price of the version valid on their
day (``sql/V006__one_price_path.sql``, :mod:`noetl_analytics.rollups`); every view
(static render, interactive dashboard, Grafana, ``facts query`` examples,
FOCUS export, budgets) reads ``cost_line_day``; Dagster's run/asset cost
metadata prices the same lines with the same table in Python
(:func:`cost_of_events`), before the facts exist.

The price file (``analytics/noetl_analytics/prices.yaml``) is a list of versions, each valid
from a day (a day is priced by the latest version whose ``valid_from`` is on
or before it, the SQL's ASOF JOIN)::

    currency: USD
    worker_class_by_kind: {duckdb: cpu.large}
    distribution: {idle: proportional, shared: proportional, shared_tenants: []}
    versions:
      - version: "2026-01"
        valid_from: 2026-01-01
        compute: {default: 0.031611, cpu.large: 0.063222}   # per core-hour, by worker class
        ram: 0.004237                                        # per GB-hour (a number = {default: n})
        gpu: {default: 2.48}                                 # per GPU-hour, by GPU class
        egress: 0.09                                         # per GB, by region
        storage: {default: 0.023, file: 0.02}                # per GB-month, by store; billed once
        storage_months: 1                                    #   at creation for this many months
        call: {http: 0.0000004}                              # per task attempt, by tool kind
        quantum: {shot: 0.0009, qpu_second: 1.6}
        platform: 0.031611                                   # per core-hour of engine CPU (default: compute)
        capacity: {cores: 2, ram_gb: 8, gpus: 0}             # what is provisioned: idle = capacity - used

Shorthands in a version: ``cpu_core_hour``, ``ram_gb_hour``, ``gpu_hour``,
``egress_gb``, ``storage_gb_month``, ``shot``, ``qpu_second``,
``capacity_cores``, ``capacity_ram_gb``, ``capacity_gpus``. ``allocation:``
is accepted for ``versions:``.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
from collections.abc import Container, Iterable
from dataclasses import dataclass, field
from datetime import UTC, date, datetime
from pathlib import Path
from typing import Any

from noetl_dagster.engine.usage_lines import (  # noqa: F401 - moved to the engine (the execution summary), names kept here
    _REF_EVENTS,
    _TERMINAL,
    UNITS,
    BilledRefs,
    UsageLine,
    _dict,
    _maxed,
    _number,
    _ref,
    _storage,
    _text,
    created_refs,
    requests_of,
    usage_lines,
)

DEFAULT_PRICES = Path(__file__).parent / "prices.yaml"

QUANTUM_ITEMS = ("shot", "qpu_second")
# categories whose item is a worker class (resolved from worker_class_by_kind when the event names none)
CLASS_CATEGORIES = ("compute", "ram", "gpu")
# the Dagster metadata / Cost component of a (category, item): quantum splits by unit
COMPONENTS = ("cpu", "ram", "gpu", "egress", "storage", "call", "shot", "qpu", "platform")
DISTRIBUTION_RULES = ("proportional", "even", "unallocated")
_SHORTHANDS = {
    "cpu_core_hour": ("compute", "default"),
    "ram_gb_hour": ("ram", "default"),
    "gpu_hour": ("gpu", "default"),
    "egress_gb": ("egress", "default"),
    "storage_gb_month": ("storage", "default"),
    "shot": ("quantum", "shot"),
    "qpu_second": ("quantum", "qpu_second"),
}
_CAPACITY = {"capacity_cores": "cores", "capacity_ram_gb": "ram_gb", "capacity_gpus": "gpus"}
_VERSION_KEYS = (
    set(UNITS)
    | set(_SHORTHANDS)
    | set(_CAPACITY)
    | {"version", "valid_from", "storage_months", "capacity", "units", "sources"}
)
# the byte-sized categories and the byte unit their price may be stated in (`units:` of a version);
# the cost lines count GB (1e9 bytes), so a price per GiB (2**30 bytes) is converted, not reused
BYTE_UNITS = {"GB": 1.0, "GiB": 1e9 / 2**30}
_BYTE_CATEGORIES = ("ram", "egress", "storage")
_TOP_KEYS = {"currency", "worker_class_by_kind", "distribution", "versions", "allocation"}


def component(category: str, item: str) -> str:
    if category == "compute":
        return "cpu"
    if category == "quantum":
        return "qpu" if item == "qpu_second" else "shot"
    return category


class PriceConfigError(ValueError):
    pass


def _price(x: Any, where: str) -> float:
    if isinstance(x, bool) or not isinstance(x, (int, float)) or x < 0 or x != x:
        raise PriceConfigError(f"{where} must be a non-negative number, got {x!r}")
    return float(x)


@dataclass(frozen=True)
class PriceVersion:
    version: str
    valid_from: date
    prices: dict[str, dict[str, float]]
    storage_months: float = 1.0
    capacity: dict[str, float] = field(default_factory=dict)

    def price(self, category: str, item: str) -> float:
        """Price per unit (storage: x storage_months) of ``item``, else of ``default``, else 0."""
        section = self.prices.get(category) or {}
        p = section.get(item, section.get("default", 0.0))
        return p * self.storage_months if category == "storage" else p

    def capacity_cost_day(self) -> float:
        """One day of the provisioned capacity at this version's default prices."""
        cap = self.capacity
        return 24 * (
            cap.get("cores", 0) * self.price("compute", "default")
            + cap.get("ram_gb", 0) * self.price("ram", "default")
            + cap.get("gpus", 0) * self.price("gpu", "default")
        )


def _version(raw: Any, i: int, source: str) -> PriceVersion:
    where = f"{source}: versions[{i}]"
    if not isinstance(raw, dict):
        raise PriceConfigError(f"{where} must be a mapping")
    unknown = set(map(str, raw)) - _VERSION_KEYS
    if unknown:
        raise PriceConfigError(
            f"{where}: unknown keys {sorted(unknown)} (known: {', '.join(sorted(_VERSION_KEYS))})"
        )
    name = str(raw.get("version") or f"v{i + 1}")
    try:
        valid_from = date.fromisoformat(str(raw.get("valid_from") or "1970-01-01"))
    except ValueError:
        raise PriceConfigError(
            f"{where}: valid_from must be a date (YYYY-MM-DD), got {raw.get('valid_from')!r}"
        ) from None
    prices: dict[str, dict[str, float]] = {c: {} for c in UNITS}
    for category in UNITS:
        section = raw.get(category)
        if section is None:
            continue
        if not isinstance(section, dict):
            section = {"default": section}
        for item, p in section.items():
            prices[category][str(item)] = _price(p, f"{where}: {category}.{item}")
        if category == "quantum" and set(prices["quantum"]) - set(QUANTUM_ITEMS):
            raise PriceConfigError(
                f"{where}: quantum prices are per {' and per '.join(QUANTUM_ITEMS)},"
                f" got {sorted(set(prices['quantum']) - set(QUANTUM_ITEMS))}"
            )
    for key, (category, item) in _SHORTHANDS.items():
        if key in raw:
            prices[category][item] = _price(raw[key], f"{where}: {key}")
    units = raw.get("units") or {}
    if not isinstance(units, dict) or set(units) - set(_BYTE_CATEGORIES):
        raise PriceConfigError(f"{where}: units must map {' / '.join(_BYTE_CATEGORIES)} to GB or GiB")
    for category, unit in units.items():
        if unit not in BYTE_UNITS:
            raise PriceConfigError(f"{where}: units.{category} must be GB or GiB, got {unit!r}")
        prices[category] = {k: p * BYTE_UNITS[unit] for k, p in prices[category].items()}
    sources = raw.get("sources") or {}
    if not isinstance(sources, dict) or not all(isinstance(v, str) for v in sources.values()):
        raise PriceConfigError(f"{where}: sources must map price sections to where each price comes from")
    if "default" not in prices["platform"] and "default" in prices["compute"]:
        prices["platform"]["default"] = prices["compute"]["default"]  # engine CPU costs what task CPU costs
    months = _price(raw.get("storage_months", 1), f"{where}: storage_months")
    cap_raw = raw.get("capacity") or {}
    if not isinstance(cap_raw, dict) or set(cap_raw) - set(_CAPACITY.values()):
        raise PriceConfigError(f"{where}: capacity must map cores / ram_gb / gpus to numbers")
    capacity = {str(k): _price(v, f"{where}: capacity.{k}") for k, v in cap_raw.items()}
    for key, name_ in _CAPACITY.items():
        if key in raw:
            capacity[name_] = _price(raw[key], f"{where}: {key}")
    return PriceVersion(name, valid_from, prices, months, capacity)


@dataclass(frozen=True)
class PriceTable:
    currency: str = "USD"
    versions: tuple[PriceVersion, ...] = ()
    worker_class_by_kind: dict[str, str] = field(default_factory=dict)
    distribution: dict[str, Any] = field(default_factory=dict)
    source: str = "<inline>"

    @classmethod
    def from_dict(cls, raw: Any, source: str = "<inline>") -> PriceTable:
        if not isinstance(raw, dict):
            raise PriceConfigError(f"{source}: the price table must be a mapping")
        legacy = {"compute", "storage", "egress", "call", "quantum", "storage_months"} & set(raw)
        if legacy:
            raise PriceConfigError(
                f"{source}: top-level price sections {sorted(legacy)} are no longer read: prices live in"
                " versions (`versions: [{version, valid_from, compute: <per core-hour>, ...}]`), one table for every view"
            )
        unknown = set(raw) - _TOP_KEYS
        if unknown:
            raise PriceConfigError(
                f"{source}: unknown price sections {sorted(unknown)} (known: {sorted(_TOP_KEYS)})"
            )
        mapping = raw.get("worker_class_by_kind") or {}
        if not isinstance(mapping, dict) or not all(isinstance(v, str) for v in mapping.values()):
            raise PriceConfigError(
                f"{source}: worker_class_by_kind must map tool kinds to worker class names"
            )
        currency = raw.get("currency", "USD")
        if not isinstance(currency, str) or not currency:
            raise PriceConfigError(f"{source}: currency must be a non-empty string")
        versions_raw = raw.get("versions", raw.get("allocation"))
        if versions_raw is None:
            versions_raw = []
        if isinstance(versions_raw, dict):
            versions_raw = [versions_raw]
        if not isinstance(versions_raw, list):
            raise PriceConfigError(f"{source}: versions must be a list of price versions")
        versions = tuple(_version(v, i, source) for i, v in enumerate(versions_raw))
        names = [v.version for v in versions]
        if len(set(names)) != len(names):
            raise PriceConfigError(f"{source}: version names must be unique, got {names}")
        return cls(currency, versions, {str(k): v for k, v in mapping.items()},
                   _distribution(raw.get("distribution"), source), source)  # fmt: skip

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

    # -- lookups (the SQL's, in Python) ------------------------------------------------
    def version_on(self, day: date) -> PriceVersion | None:
        """The version that prices ``day``: the latest ``valid_from`` on or before it; None before the first."""
        best = None
        for v in self.versions:
            if v.valid_from <= day and (
                best is None or (v.valid_from, v.version) > (best.valid_from, best.version)
            ):
                best = v
        return best

    def resolve_item(self, category: str, item: str, kind: str) -> str:
        if item:
            return item
        if category in CLASS_CATEGORIES:
            return self.worker_class_by_kind.get(kind or "", "default")
        return "default"

    def line_cost(self, line: UsageLine, day: date) -> tuple[float, str]:
        """(amount, version) of one usage line on ``day``."""
        v = self.version_on(day)
        if v is None:
            return 0.0, ""
        return line.quantity * v.price(
            line.category, self.resolve_item(line.category, line.item, line.kind)
        ), v.version

    # -- what ClickHouse loads -----------------------------------------------------------
    def price_rows(self) -> list[list[Any]]:
        """``price_line`` rows: version, valid_from, category, item, unit, price, multiplier, currency."""
        out = []
        for v in self.versions:
            for category, items in v.prices.items():
                mult = v.storage_months if category == "storage" else 1.0
                for item, p in sorted(items.items()):
                    unit = item if category == "quantum" else UNITS[category]
                    out.append([v.version, v.valid_from, category, item, unit, p, mult, self.currency])
        return out

    def version_rows(self) -> list[list[Any]]:
        """``price_version`` rows (one per version: its day, default prices and capacity)."""
        return [
            [v.version, v.valid_from, self.currency, v.price("compute", "default"), v.price("ram", "default"),
             v.price("egress", "default"), 0.0, v.capacity.get("cores", 0.0), v.capacity.get("ram_gb", 0.0),
             v.price("quantum", "shot"), v.price("quantum", "qpu_second"), v.capacity.get("gpus", 0.0),
             v.price("gpu", "default"), v.capacity_cost_day()]
            for v in self.versions
        ]  # fmt: skip

    @functools.cached_property
    def _digest(self) -> str:
        body = {"currency": self.currency, "map": self.worker_class_by_kind, "distribution": self.distribution,
                "prices": self.price_rows(), "versions": self.version_rows()}  # fmt: skip
        return hashlib.sha256(json.dumps(body, default=str, sort_keys=True).encode()).hexdigest()[:16]

    def fingerprint(self) -> str:
        """A digest of everything that changes a price: a store re-prices its history when it changes
        (computed once per table: every finishing op tags its run with it)."""
        return self._digest


def _distribution(raw: Any, source: str) -> dict[str, Any]:
    raw = raw or {}
    if not isinstance(raw, dict) or set(raw) - {"idle", "shared", "shared_tenants"}:
        raise PriceConfigError(
            f"{source}: distribution takes idle, shared (rules) and shared_tenants (a list)"
        )
    out = {"idle": raw.get("idle", "proportional"), "shared": raw.get("shared", "proportional")}
    for k in ("idle", "shared"):
        if out[k] not in DISTRIBUTION_RULES:
            raise PriceConfigError(
                f"{source}: distribution.{k} must be one of {', '.join(DISTRIBUTION_RULES)}, got {out[k]!r}"
            )
    tenants = raw.get("shared_tenants") or []
    if not isinstance(tenants, list) or not all(isinstance(t, str) and t for t in tenants):
        raise PriceConfigError(f"{source}: distribution.shared_tenants must be a list of tenant ids")
    out["shared_tenants"] = sorted(tenants)
    return out


def utc_day(timestamp: Any) -> date:
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


@dataclass(frozen=True)
class Cost:
    """Priced usage lines by component (:data:`COMPONENTS`), with the price versions that priced them."""

    amounts: dict[str, float] = field(default_factory=dict)
    currency: str = "USD"
    versions: tuple[str, ...] = ()
    attempts: int = 0

    def __getattr__(self, name: str) -> float:
        if name in COMPONENTS:
            return self.amounts.get(name, 0.0)
        raise AttributeError(name)

    @property
    def quantum(self) -> float:
        return self.amounts.get("shot", 0.0) + self.amounts.get("qpu", 0.0)

    @property
    def total(self) -> float:
        return sum(self.amounts.values())

    @property
    def price_version(self) -> str:
        return ",".join(self.versions)

    def __add__(self, other: Cost) -> Cost:
        if not isinstance(other, Cost):
            return NotImplemented
        amounts = dict(self.amounts)
        for k, v in other.amounts.items():
            amounts[k] = amounts.get(k, 0.0) + v
        return Cost(amounts, self.currency, tuple(sorted(set(self.versions) | set(other.versions))),
                    self.attempts + other.attempts)  # fmt: skip

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"total": self.total, **{c: self.amounts.get(c, 0.0) for c in COMPONENTS}}
        out.update(currency=self.currency, price_version=self.price_version, attempts=self.attempts)
        return out


def event_cost(
    prices: PriceTable,
    name: str,
    data: Any,
    timestamp: Any,
    billed: BilledRefs | None = None,
    execution_id: str | None = None,
) -> Cost:
    """The priced usage lines of one event; ``billed``: the stored references its execution billed
    so far (engine/usage_lines.BilledRefs: once per execution, by the first event naming one)."""
    day = utc_day(timestamp)
    amounts: dict[str, float] = {}
    versions: set[str] = set()
    lines = (
        usage_lines(name, data)
        if billed is None
        else [UsageLine(*t) for t in billed.lines(name, data, execution_id)]
    )
    for line in lines:
        amount, version = prices.line_cost(line, day)
        c = component(line.category, line.item)
        amounts[c] = amounts.get(c, 0.0) + amount
        if version:
            versions.add(version)
    return Cost(amounts, prices.currency, tuple(sorted(versions)), 1 if name == "task.done" else 0)


def cost_of_events(
    prices: PriceTable,
    events: Iterable[Any],
    step_runs: Container[str] | None = None,
    billed: BilledRefs | None = None,
) -> dict[str, Cost]:
    """Cost per step of ``events`` (objects with ``name``, ``step``, ``step_run_id``, ``data``,
    ``timestamp``, ``execution_id``): every line :func:`usage_lines` finds — task attempts (failed
    ones too), stored references (billed per execution, :class:`BilledRefs`: events of several
    executions bill each its own), and the execution's platform line (step ``""``); ``step_runs``,
    when given, keeps only the events of those step runs; ``billed``: the references the execution
    billed before ``events`` (a window of one execution's log: an op's metadata), else none."""
    out: dict[str, Cost] = {}
    ledgers: dict[Any, BilledRefs] = {}
    for ev in events:
        eid = getattr(ev, "execution_id", None)
        ledger = ledgers.get(eid)
        if ledger is None:
            ledger = ledgers[eid] = billed if billed is not None and not ledgers else BilledRefs()
        if step_runs is not None and ev.step_run_id not in step_runs:
            if ev.name in _REF_EVENTS or ev.name == "task.done":  # a reference it names is billed to it
                ledger.lines(ev.name, ev.data, eid)
            continue
        c = event_cost(prices, ev.name, ev.data, ev.timestamp, ledger, eid)
        if not c.amounts and not c.attempts:
            continue
        step = ev.step or ""
        out[step] = out[step] + c if step in out else c
    return out
