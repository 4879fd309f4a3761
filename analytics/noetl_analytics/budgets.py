"""Monthly budgets per tenant (or tenant + project), checked against the priced table.

A budget file (YAML/JSON)::

    budgets:
      - tenant: acme
        project: sales        # optional: the project's own lines only (idle/shared rows have no project)
        monthly: 250.0        # in the price table's currency
        action: warn          # warn: a logged warning and a tagged alert run | fail: the alert run fails
        forecast: true        # also alert when the month's forecast crosses it (default true)

Month-to-date is the sum of ``cost_line_day`` for the tenant (project) from the
first of the current UTC month; the forecast extends it linearly to the whole
month (month-to-date / days elapsed x days in the month, at least one day elapsed). The
forecast alerts only once ``FORECAST_MIN_DAYS`` days of the month have elapsed: before that it
extrapolates a day or two of data ~15-30x (one busy first day would fail every run of the month);
month-to-date crossing the budget alerts from day one.
"""

from __future__ import annotations

import calendar
import os
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

from noetl_analytics.store import FactsStore

ACTIONS = ("warn", "fail")
FORECAST_MIN_DAYS = 3.0  # elapsed days of the month before a forecast may alert (and fail runs)


class BudgetConfigError(ValueError):
    pass


@dataclass(frozen=True)
class Budget:
    tenant: str
    monthly: float
    project: str | None = None
    action: str = "warn"
    forecast: bool = True

    @property
    def name(self) -> str:
        return self.tenant + (f"/{self.project}" if self.project else "")


@dataclass(frozen=True)
class BudgetStatus:
    budget: Budget
    month: str
    month_to_date: float
    forecast: float
    crossed: str | None  # "exceeded" (month-to-date) | "forecast" | None

    def tags(self) -> dict[str, str]:
        return {
            "noetl/budget": self.budget.name, "noetl/budget_status": self.crossed or "ok",
            "noetl/budget_month": self.month, "noetl/budget_limit": f"{self.budget.monthly:g}",
            "noetl/budget_month_to_date": f"{self.month_to_date:.6f}", "noetl/budget_forecast": f"{self.forecast:.6f}",
            "noetl/budget_action": self.budget.action,
        }  # fmt: skip

    def message(self) -> str:
        what = "month-to-date" if self.crossed == "exceeded" else "forecast"
        value = self.month_to_date if self.crossed == "exceeded" else self.forecast
        return (f"budget {self.budget.name} {self.month}: {what} cost {value:.6f} crosses the monthly budget"
                f" {self.budget.monthly:g} (month-to-date {self.month_to_date:.6f})")  # fmt: skip


def parse_budgets(raw: Any, source: str = "<inline>") -> list[Budget]:
    if isinstance(raw, dict):
        raw = raw.get("budgets")
    if not isinstance(raw, list):
        raise BudgetConfigError(f"{source}: budgets must be a list (under `budgets:`)")
    out = []
    for i, b in enumerate(raw):
        where = f"{source}: budgets[{i}]"
        if not isinstance(b, dict) or set(b) - {"tenant", "project", "monthly", "action", "forecast"}:
            raise BudgetConfigError(f"{where}: takes tenant, project, monthly, action, forecast")
        tenant, monthly = b.get("tenant"), b.get("monthly")
        if not isinstance(tenant, str) or not tenant:
            raise BudgetConfigError(f"{where}: tenant must be a non-empty string")
        if isinstance(monthly, bool) or not isinstance(monthly, (int, float)) or monthly <= 0:
            raise BudgetConfigError(f"{where}: monthly must be a positive number, got {monthly!r}")
        action = b.get("action", "warn")
        if action not in ACTIONS:
            raise BudgetConfigError(f"{where}: action must be warn or fail, got {action!r}")
        project = b.get("project")
        if project is not None and not isinstance(project, str):
            raise BudgetConfigError(f"{where}: project must be a string")
        out.append(Budget(tenant, float(monthly), project or None, action, bool(b.get("forecast", True))))
    return out


def load_budgets(source: str | os.PathLike[str] | list[dict[str, Any]]) -> list[Budget]:
    if isinstance(source, list):
        return parse_budgets(source)
    path = Path(source)
    if not path.is_file():
        raise BudgetConfigError(f"budget file not found: {path}")
    try:
        raw = yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        raise BudgetConfigError(f"{path}: not valid YAML/JSON: {' '.join(str(e).split())}") from e
    return parse_budgets(raw, str(path))


def evaluate(store: FactsStore, budgets: list[Budget], now: datetime | None = None) -> list[BudgetStatus]:
    now = (now or datetime.now(UTC)).astimezone(UTC)
    start = now.date().replace(day=1)
    days_in_month = calendar.monthrange(now.year, now.month)[1]
    elapsed = max(
        (now - datetime.combine(start, datetime.min.time(), tzinfo=UTC)).total_seconds() / 86400, 1.0
    )
    out = []
    for b in budgets:
        mtd = float(store.scalar(
            "SELECT sum(amount) FROM $db.cost_line_day FINAL WHERE tenant_id = {t:String}"
            " AND (project_id = {p:String} OR {p:String} = '') AND day >= {start:Date} AND day <= {today:Date}",
            {"t": b.tenant, "p": b.project or "", "start": start, "today": now.date()},
        ) or 0.0)  # fmt: skip
        forecast = mtd / elapsed * days_in_month
        crossed = (
            "exceeded"
            if mtd >= b.monthly
            else (
                "forecast" if b.forecast and elapsed >= FORECAST_MIN_DAYS and forecast >= b.monthly else None
            )
        )
        out.append(BudgetStatus(b, start.strftime("%Y-%m"), mtd, forecast, crossed))
    return out
