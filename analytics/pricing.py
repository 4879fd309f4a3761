"""The configurable price table for tenant-cost showback.

A YAML (or JSON) mapping with sections ``compute`` (per CPU-second by worker
class), ``storage`` (per GB-month by storage class) with ``storage_months``,
``egress`` (per GB by region), ``call`` (per call by tool kind), ``quantum``
(per ``shot`` and per ``qpu_second``),
``worker_class_by_kind`` and ``currency``. See ``analytics/prices.yaml``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from datetime import date
from pathlib import Path
from typing import Any

import yaml

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
            if p.is_file():
                return cls._read(p)
            if candidate is path or candidate == os.environ.get("NOETL_DAGSTER_PRICES"):
                raise PriceConfigError(f"price table not found: {p}")
        return cls._read(DEFAULT_PRICES)

    @classmethod
    def _read(cls, path: Path) -> PriceTable:
        try:
            raw = yaml.safe_load(path.read_text())
        except yaml.YAMLError as e:
            raise PriceConfigError(f"{path}: not valid YAML/JSON: {e}") from e
        return cls.from_dict(raw, str(path))

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
