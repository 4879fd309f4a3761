"""Render the facts dashboard: one PNG per panel (matplotlib) and a
self-contained HTML page (charts inlined as data URIs, each panel's data table
and the SQL behind it).

The page is one viewer's (``noetl_analytics.dashboard_access``): every panel reads through the
dashboard's tenancy gate, :class:`~analytics.dashboard_access.TenantScope`, like the
interactive server, so a page rendered for a tenant holds that tenant's rows only; all
tenants only for an explicit :meth:`Viewer.everyone`."""

from __future__ import annotations

import base64
import html
import math
from dataclasses import dataclass, field
from datetime import UTC, date, datetime
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only: no display on servers and CI

import matplotlib.dates as mdates  # noqa: E402
import matplotlib.pyplot as plt  # noqa: E402

from noetl_analytics.dashboard_access import TenantScope, Viewer  # noqa: E402
from noetl_analytics.panels import PANELS, Panel  # noqa: E402
from noetl_analytics.store import FactsStore  # noqa: E402


@dataclass
class PanelResult:
    panel: Panel
    columns: list[str]
    rows: list[tuple]
    png: Path | None = None


@dataclass
class Dashboard:
    html: Path
    panels: list[PanelResult] = field(default_factory=list)

    @property
    def pngs(self) -> list[Path]:
        return [p.png for p in self.panels if p.png is not None]


def _fmt(value: Any, unit: str = "", percent: bool = False) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        if percent:
            return f"{value * 100:.1f}%"
        if math.isnan(value):
            return ""
        if unit == "currency" or abs(value) < 0.01:
            return f"{value:.6g}"
        return f"{value:,.2f}"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, (datetime, date)):
        return value.isoformat()
    return str(value)


def _human_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:,.0f} {unit}" if unit == "B" else f"{n:,.2f} {unit}"
        n /= 1000
    return f"{n} B"  # pragma: no cover


def _chart(result: PanelResult, path: Path, currency: str) -> Path | None:
    p, cols, rows = result.panel, result.columns, result.rows
    if p.chart == "stat":
        return None
    fig, ax = plt.subplots(figsize=(9, 4.2), dpi=110)
    ylabel = currency if p.unit == "currency" else p.unit
    if not rows:
        ax.text(0.5, 0.5, "no data yet", ha="center", va="center", fontsize=14, color="#888")
        ax.set_axis_off()
    elif p.chart == "timeseries":
        xi, si, yi = cols.index(p.x), cols.index(p.series), cols.index(p.y[0])
        series: dict[str, tuple[list, list]] = {}
        for r in rows:
            xs, ys = series.setdefault(str(r[si]), ([], []))
            xs.append(r[xi])
            ys.append(r[yi] or 0.0)
        if len({r[xi] for r in rows}) == 1:
            # a single day: one bar per series reads better than a line of one point
            names = sorted(series)
            ax.bar(names, [sum(series[n][1]) for n in names], color=[f"C{i}" for i in range(len(names))])
            ax.set_xlabel(f"{p.series} · {_fmt(rows[0][xi])[:10]}")
            ax.set_ylabel(ylabel)
            ax.grid(axis="y", alpha=0.3)
        else:
            for name, (xs, ys) in sorted(series.items()):
                ax.plot(xs, ys, marker="o", label=name)
            ax.xaxis.set_major_formatter(mdates.DateFormatter("%Y-%m-%d"))
            fig.autofmt_xdate()
            ax.set_ylabel(ylabel)
            ax.legend(title=p.series, fontsize=8)
            ax.grid(alpha=0.3)
    else:  # barh, one bar group per row, one bar per value column
        labels = [str(r[cols.index(p.x)]) for r in rows][::-1]
        n = len(p.y)
        height = 0.8 / n
        for k, col in enumerate(p.y):
            vals = [(r[cols.index(col)] or 0.0) for r in rows][::-1]
            if p.percent:
                vals = [v * 100 for v in vals]
            ys = [i + (k - (n - 1) / 2) * height for i in range(len(rows))]
            ax.barh(ys, vals, height=height, label=col)
        ax.set_yticks(range(len(rows)), labels, fontsize=8)
        ax.set_xlabel("%" if p.percent else ylabel)
        if n > 1:
            ax.legend(fontsize=8)
        ax.grid(axis="x", alpha=0.3)
    ax.set_title(p.title)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def render_dashboard(
    store: FactsStore,
    out_dir: str | Path,
    *,
    viewer: Viewer,
    days: int | None = None,
    title: str = "NoETL facts",
    currency: str = "USD",
) -> Dashboard:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    results = []
    scope = TenantScope(store, viewer)  # whose rows: the one gate, as for the server
    for p in PANELS:
        cols, rows = scope.query(p.render_sql(store.database, days=days))
        result = PanelResult(p, cols, rows)
        result.png = _chart(result, out / f"{p.key}.png", currency)
        results.append(result)
    page = out / "index.html"
    page.write_text(_html(results, title, store, days, currency, viewer))
    return Dashboard(page, results)


def _html(
    results: list[PanelResult], title: str, store: FactsStore, days: int | None, currency: str, viewer: Viewer
) -> str:
    generated = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    scope = f"last {days} days" if days else "all time"
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'>",
        f"<title>{html.escape(title)}</title>",
        "<style>body{font-family:system-ui,sans-serif;margin:2rem;max-width:1100px;color:#222}"
        "h1{margin-bottom:.2rem}.meta{color:#666;margin-bottom:1.5rem}"
        ".tiles{display:flex;flex-wrap:wrap;gap:.8rem;margin-bottom:1.5rem}"
        ".tile{border:1px solid #ddd;border-radius:8px;padding:.7rem 1rem;min-width:120px}"
        ".tile b{display:block;font-size:1.4rem}.tile span{color:#666;font-size:.85rem}"
        "section{margin-bottom:2.5rem}img{max-width:100%;border:1px solid #eee}"
        "table{border-collapse:collapse;font-size:.85rem;margin:.6rem 0}"
        "td,th{border:1px solid #ddd;padding:.25rem .5rem;text-align:right}td:first-child,th:first-child{text-align:left}"
        "pre{background:#f6f6f6;padding:.7rem;overflow-x:auto;font-size:.8rem}</style></head><body>",
        f"<h1>{html.escape(title)}</h1>",
        f"<div class='meta'>{html.escape(viewer.name)} · {html.escape(scope)} · generated {generated} · store {html.escape(repr(store))}</div>",
    ]
    for r in results:
        p = r.panel
        parts.append(
            f"<section id='{p.key}'><h2>{html.escape(p.title)}</h2><p>{html.escape(p.description)}</p>"
        )
        if p.chart == "stat":
            parts.append("<div class='tiles'>")
            row = r.rows[0] if r.rows else ()
            for name, value in zip(r.columns, row, strict=False):
                shown = _human_bytes(value or 0) if name == "bytes_stored" else _fmt(value)
                if name in ("cost", "cost_of_which_idle"):
                    shown = f"{_fmt(float(value or 0.0), 'currency')} {currency}"
                parts.append(
                    f"<div class='tile'><b>{html.escape(shown)}</b><span>{html.escape(name)}</span></div>"
                )
            parts.append("</div>")
        elif r.png is not None:
            data = base64.b64encode(r.png.read_bytes()).decode()
            parts.append(f"<img alt='{html.escape(p.title)}' src='data:image/png;base64,{data}'>")
        if p.chart != "stat":
            parts.append("<details><summary>data</summary><table><tr>")
            parts.extend(f"<th>{html.escape(c)}</th>" for c in r.columns)
            parts.append("</tr>")
            for row in r.rows:
                parts.append(
                    "<tr>"
                    + "".join(
                        f"<td>{html.escape(_fmt(v, p.unit, p.percent and c in p.y))}</td>"
                        for c, v in zip(r.columns, row, strict=True)
                    )
                    + "</tr>"
                )
            parts.append("</table></details>")
        parts.append(f"<details><summary>SQL</summary><pre>{html.escape(p.sql)}</pre></details></section>")
    parts.append("</body></html>")
    return "\n".join(parts)
