"""``noetl-dagster explain ID`` and ``noetl-dagster diff A B`` (issue 36).

``explain``: every step run of an execution in order (times, duration, outcome, retries, loop
counts, measured cost, fired arcs, errors with the playbook line), then tokens per arc.
``diff``: the first event where two executions diverge and the context that decided it.
Both read the event store (``--event-store``, ``--data-dir``); ``--json`` prints the data the
dashboard's execution page draws. An unknown id exits 2 with one line.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import click

from noetl_dagster.commands.errors import EXIT_BAD_INPUT
from noetl_dagster.util.jsonutil import dumps

ROWS = 200  # step runs printed before "... N more (--all)"


def _fail(message: str) -> None:
    click.echo(f"error: {message}", err=True)
    sys.exit(EXIT_BAD_INPUT)


def _views(event_store: str | None, data_dir: str | None, prices: str | None) -> Any:
    from noetl_analytics.execution_view import ExecutionViews  # noqa: PLC0415
    from noetl_dagster.storage.event_stores import open_event_store  # noqa: PLC0415

    try:
        return ExecutionViews(
            open_event_store(event_store, data_dir=data_dir), prices=prices, data_dir=data_dir
        )
    except ValueError as e:
        _fail(str(e))


def _common(f: Any) -> Any:
    f = click.option("--json", "as_json", is_flag=True, help="Print the data as one JSON object.")(f)
    f = click.option("--prices", type=click.Path(dir_okay=False), help="Price table for the measured cost.")(
        f
    )
    f = click.option("--data-dir", type=click.Path(file_okay=False))(f)
    return click.option("--event-store", help="Event store URL (default: $NOETL_DAGSTER_HOME/events.db).")(f)


def _money(x: float) -> str:
    return f"{x:.6f}" if x == 0 or x >= 1e-3 else f"{x:.2e}"


def _text(value: Any, n: int = 80) -> str:
    s = value if isinstance(value, str) else json.dumps(value, default=str)
    s = " ".join(s.split())  # one line: a step name or message with newlines stays on its row
    # control characters (a step named "\x1b]0;…" would drive the terminal) show escaped
    s = "".join(c if c.isprintable() else repr(c)[1:-1] for c in s)
    return s if len(s) <= n else s[: n - 1] + "…"


@click.command()
@click.argument("execution_id")
@_common
@click.option("--all", "show_all", is_flag=True, help=f"Print every step run (default: the first {ROWS}).")
def explain(execution_id: str, event_store: str | None, data_dir: str | None, prices: str | None, as_json: bool,
            show_all: bool) -> None:  # fmt: skip
    """What happened inside an execution: step runs, retries, loops, arcs, cost."""
    from noetl_dagster.engine.explain import UnknownExecution  # noqa: PLC0415

    views = _views(event_store, data_dir, prices)
    try:
        page = views.explain(execution_id)
    except (UnknownExecution, ValueError) as e:
        _fail(str(e))
    if as_json:
        click.echo(dumps(page))
        return
    ex, tot, cur = page["execution"], page["totals"], page["currency"]
    click.echo(f"execution {ex['execution_id']}  {_text(ex.get('playbook') or '', 200)}  {ex['status']}  "
               f"{ex['duration_ms'] / 1000:.3f} s  tenant {ex['tenant']}/{ex['project']}")  # fmt: skip
    click.echo(f"  {tot['step_runs']} step runs, {tot['failed_runs']} failed, {tot['retries']} retries, "
               f"{tot['iterations']} loop iterations, {tot['sub_executions']} sub-playbooks, "
               f"cpu {tot['cpu_s']:.3f} s, cost {_money(tot['cost'])} {cur} (platform {_money(tot['platform_cost'])})")  # fmt: skip
    if page["playbook_missing"]:
        click.echo(f"  (no playbook lines or undeclared arcs: {page['playbook_missing']})")
    file = ex.get("file") or ""
    runs = page["runs"] if show_all else page["runs"][:ROWS]
    click.echo(f"{'start s':>9} {'took s':>9}  {'status':<8} step")
    for r in runs:
        click.echo(_run_line(r, file, cur))
    if len(page["runs"]) > len(runs):
        click.echo(f"  ... {len(page['runs']) - len(runs)} more step runs (--all)")
    click.echo("arcs (tokens):")
    for e in page["graph"]["edges"]:
        tag = " (back-edge)" if e["back_edge"] else ""
        click.echo(f"  {_text(e['from'], 40)} -> {_text(e['to'], 40)}: {e['tokens']}{tag}")


def _run_line(r: dict[str, Any], file: str, cur: str) -> str:
    parts = [
        f"{r['start_ms'] / 1000:>9.3f} {r['duration_ms'] / 1000:>9.3f}  {r['status']:<8} {_text(r['step'], 40)}"
    ]
    if r["retries"]:
        parts.append(f"retries {r['retries']}")
    loop = r["loop"]
    if loop:
        parts.append(
            f"loop {loop['ok']}/{loop['total'] or loop['ok'] + loop['failed']} ok, {loop['failed']} failed"
        )
    if r["cost"]:
        parts.append(f"cost {_money(r['cost'])} {cur}")
    if r["fired"]:
        parts.append("-> " + ", ".join(_text(f["step"], 40) for f in r["fired"]))
    if r["sub_executions"]:
        parts.append("sub " + ", ".join(r["sub_executions"]))
    if r["reason"]:
        parts.append(f"skipped: {_text(r['reason'])}")
    line = "  ".join(parts)
    if r["error"]:
        at = r.get("error_line") or r["line"]
        where = f" ({_text(file, 300)}:{at})" if at else ""
        line += f"\n{'':>21}error: {_text(r['error'].get('message') or r['error'], 120)}{where}"
    return line


@click.command()
@click.argument("a")
@click.argument("b")
@_common
def diff(
    a: str, b: str, event_store: str | None, data_dir: str | None, prices: str | None, as_json: bool
) -> None:
    """Where execution B first diverges from A (arc, status, retries, result) and why."""
    from noetl_dagster.engine.explain import UnknownExecution  # noqa: PLC0415

    views = _views(event_store, data_dir, prices)
    try:
        d = views.diff(a, b)
    except (UnknownExecution, ValueError) as e:
        _fail(str(e))
    if as_json:
        click.echo(dumps(d))
        return
    for side in ("a", "b"):
        x = d[side]
        click.echo(f"{side.upper()} {x['execution_id']}  {_text(x['playbook'] or '', 200)}  {x['status']}")
    if not d["same_playbook"]:
        click.echo("  different playbooks: steps matched by name")
    ch = d["steps_changed"]
    if ch and any(ch.values()):
        click.echo("  steps changed between the versions: " + "; ".join(
            f"{k} {_text(', '.join(v), 400)}" for k, v in ch.items() if v))  # fmt: skip
    f = d["first"]
    if f is None:
        click.echo(
            f"no divergence: {d['compared_activations']} step activations agree (arcs, status, retries, results)"
        )
        return
    click.echo(f"first divergence ({f['kind']}): {_text(f.get('why', ''), 400)}")
    click.echo(f"  event: A #{f['a_sequence']}  B #{f['b_sequence']}")
    line = d["lines"]["a"].get(f["step"]) or d["lines"]["b"].get(f["step"])
    if line:
        click.echo(f"  step {_text(f['step'])} at {_text(d['a']['file'] or d['b']['file'], 300)}:{line}")
    for i, w in enumerate(f.get("when") or ()):
        click.echo(f"  arc {i} when: {_text(w, 300) if w is not None else '(always)'}")
    for label, diffs in (("ctx", f["ctx_diff"]), ("workload", f["workload_diff"]), ("input", f["args_diff"])):
        for k, v in diffs.items():
            click.echo(f"  {label}.{_text(k)}: A {_text(v['a'])}  B {_text(v['b'])}")
    for side in ("a", "b"):
        if f[f"{side}_error"]:
            at = f.get(f"{side}_error_line")
            where = f" ({_text(d[side]['file'] or '', 300)}:{at})" if at else ""
            click.echo(
                f"  {side.upper()} error: {_text(f[f'{side}_error'].get('message') or f[f'{side}_error'], 120)}{where}"
            )
