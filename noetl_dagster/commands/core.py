"""validate / run / replay / events / executions (SEMANTICS.md §8 is the contract)."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import click

from noetl_dagster.commands.errors import EXIT_BAD_INPUT, EXIT_FAILED, EXIT_OK
from noetl_dagster.commands.plain_output import console_width, is_plain, text_lines
from noetl_dagster.commands.plain_output import table as plain_table
from noetl_dagster.util.jsonutil import dumps


def _scope_name(ctx: click.Context, param: click.Parameter, value: str) -> str:
    """--tenant / --project: the resource locator's rule for them (the registry's too), so a run's
    scope is one every resource URI it registers can name; never a path or control characters."""
    from noetl_dagster.dsl.locator import InvalidLocator, check_scope

    try:
        return check_scope(value, param.name or "scope")
    except InvalidLocator as e:
        raise click.BadParameter(str(e)) from None


# issues about the file itself, not its content (the bounded reader's refusals): exit 2
_FILE_RULES = frozenset({"file-not-found", "cannot-read", "not-a-file"})
# `--workload @file`: read by the bounded reader, at most this many bytes
WORKLOAD_FILE_MAX_BYTES = 16 * 1024 * 1024


def _fail_input(message: str) -> None:
    click.echo(f"error: {message}", err=True)
    sys.exit(EXIT_BAD_INPUT)


@click.command()
@click.argument("files", nargs=-1, required=True, type=click.Path(dir_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Print the issues as a JSON list.")
def validate(files: tuple[str, ...], as_json: bool) -> None:
    """Validate playbooks: one `FILE:LINE: RULE: message` line per error; exit 1 if any."""
    from noetl_dagster.dsl.files import check_file_with_warnings

    unreadable = []  # missing, not a regular file (a FIFO, a device), unreadable: bad input, exit 2
    issues = []
    valid = []
    for f in files:
        pb, found, warnings = check_file_with_warnings(f)
        if found and found[0].rule in _FILE_RULES:
            unreadable.extend(found)
            continue
        issues.extend(found)
        for w in warnings:  # deprecated spellings: stderr, never an error (stdout stays the error list)
            click.echo(f"{w.file}:{w.line}: warning: {w.rule}: {w.path}: {w.message}", err=True)
        if pb is not None:
            valid.append((f, pb))
    if as_json:
        click.echo(json.dumps([i.__dict__ for i in issues], indent=2))
    else:
        for i in issues:
            click.echo(str(i))
    if not issues and not as_json:
        _cycle_warnings(valid)
    for i in unreadable:
        click.echo(str(i), err=True)
    if unreadable:
        sys.exit(EXIT_BAD_INPUT)
    if issues:
        sys.exit(EXIT_FAILED)
    if not as_json:
        click.echo(f"{len(files)} playbook(s) valid", err=True)


def _cycle_warnings(playbooks: list[tuple[str, Any]]) -> None:
    """``FILE:LINE: warning: unguarded-cycle: ...`` on stderr (not an error: the step-run cap stops such a cycle)."""
    from noetl_dagster.dsl.files import unguarded_cycles

    for f, pb in playbooks:
        for cycle in unguarded_cycles(pb):
            line = getattr(pb.step(cycle[0]), "line", None) or 1
            click.echo(
                f"{f}:{line}: warning: unguarded-cycle: {' -> '.join([*cycle, cycle[0]])} has no `when` guard; "
                "it runs until the step-run cap (executor.spec.max_step_runs)",
                err=True,
            )


def _parse_workload(text: str | None) -> dict[str, Any]:
    if not text:
        return {}
    if text.startswith("@"):
        from noetl_dagster.dsl.files import InputFileError, read_bounded_text

        try:
            text = read_bounded_text(text[1:], WORKLOAD_FILE_MAX_BYTES, what="--workload file")
        except InputFileError as e:
            _fail_input(str(e))
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        _fail_input(f"--workload is not valid JSON: {e.msg} at line {e.lineno} column {e.colno}")
    if not isinstance(value, dict):
        _fail_input("--workload must be a JSON object")
    return value


class _Progress:
    """A live step table on stderr for interactive runs; silent otherwise.

    The styled pieces are rendered by rich once (so NO_COLOR, FORCE_COLOR and a non-terminal
    stderr behave as before) and each line is written straight to the console's file: a
    ``console.print`` per line (markup parse, segment render, wrap) cost ~0.2 ms a step."""

    def __init__(self, enabled: bool):
        self.enabled = enabled
        self.count = 0
        self.t0 = time.perf_counter()
        self._file: Any = None
        if enabled and is_plain(sys.stderr):  # what rich would write there: no codes, and no rich import
            self._file = sys.stderr
            self._ok, self._failed, self._dim_on, self._dim_off = "ok", "failed", "", ""
        elif enabled:
            from rich.console import Console

            console = Console(stderr=True)
            self._file = console.file
            self._ok = _styled(console, "green", "ok")
            self._failed = _styled(console, "red", "failed")
            self._dim_on, self._dim_off = _styled(console, "dim", "\0").split("\0")

    def on_step(self, run: Any) -> None:
        self.count += 1
        if self._file is not None:
            mark = self._ok if run.ok else self._failed
            elapsed = time.perf_counter() - self.t0
            self._file.write(
                f"  {self.count:>4}  {run.step:<32} {mark}  {self._dim_on}{elapsed:6.2f}s{self._dim_off}\n"
            )


def _styled(console: Any, style: str, text: str) -> str:
    """text in style as this console writes it (ANSI codes, or plain text when it has no colors)."""
    with console.capture() as cap:
        console.print(f"[{style}]{text}[/]", end="", highlight=False)
    return cap.get()


@click.command()
@click.argument("file", type=click.Path(dir_okay=False))
@click.option("--workload", help="JSON object merged over the playbook's workload (or @file.json).")
@click.option("--runner", type=click.Choice(["local", "dagster"]), default="local", show_default=True)
@click.option(
    "--json", "as_json", is_flag=True, help="Print one JSON object: execution_id, status, ctx, results, runs."
)
@click.option(
    "--catalog",
    "catalog_dirs",
    multiple=True,
    type=click.Path(file_okay=False),
    help="Extra directory of sub-playbooks.",
)
@click.option(
    "--event-store",
    help="Event store URL (sqlite:///path or postgresql://...; default $NOETL_EVENT_STORE_URL). The local "
    "runner writes the execution locally and pushes it there at exit; without one it stays local.",
)
@click.option(
    "--data-dir",
    type=click.Path(file_okay=False),
    help="Data directory (default $NOETL_DAGSTER_HOME or ./.noetl).",
)
@click.option(
    "--offline", is_flag=True, help="Local runner: keep the execution local; push it later (push ID)."
)
@click.option(
    "--durable",
    is_flag=True,
    help="Local runner: commit every step into the event store (default SQLite <data dir>/events.db) "
    "instead of the local files.",
)
@click.option("--tenant", default="default", show_default=True, callback=_scope_name)
@click.option("--project", default="default", show_default=True, callback=_scope_name)
@click.option(
    "--mode",
    type=click.Choice(["default", "per_step"]),
    default="default",
    help="Dagster runner: job layout.",
)
@click.option(
    "--detach", is_flag=True, help="Dagster runner: only request the execution; the sensor launches it."
)
@click.option("--quiet", "-q", is_flag=True, help="No progress lines.")
@click.option(
    "--max-step-runs",
    type=click.IntRange(1, 10_000_000),
    default=None,
    help="Fail the execution after this many step runs (default: executor.spec.max_step_runs, else 10000).",
)
def run(
    file: str,
    workload: str | None,
    runner: str,
    as_json: bool,
    catalog_dirs: tuple[str, ...],
    event_store: str | None,
    data_dir: str | None,
    offline: bool,
    durable: bool,
    tenant: str,
    project: str,
    mode: str,
    detach: bool,
    quiet: bool,
    max_step_runs: int | None,
) -> None:
    """Run a playbook to completion. Exit 0 completed, 1 failed, 2 invalid input."""
    # an unchanged playbook comes validated from the parse cache: no YAML, no validator built, and for
    # the local runner in its ready-to-run form, without pydantic (dsl/ready.py; issue 35)
    from noetl_dagster.dsl.cache import load_playbook_cached

    overrides = _parse_workload(workload)
    try:
        pb = load_playbook_cached(file, ready=runner == "local")
    except FileNotFoundError as e:
        _fail_input(str(e))
    except Exception as e:
        from noetl_dagster.dsl import PlaybookInvalid  # the parser: imported by the miss that raised this

        if not isinstance(e, PlaybookInvalid):
            raise
        for i in e.issues:
            click.echo(str(i), err=True)
        sys.exit(EXIT_BAD_INPUT)
    if max_step_runs is not None:
        # a copy: load_playbook's parsed playbooks are shared within the process
        executor = pb.executor.model_copy(
            update={"spec": {**pb.executor.spec, "max_step_runs": max_step_runs}}
        )
        pb = pb.model_copy(update={"executor": executor})
    progress = _Progress(enabled=not as_json and not quiet)
    from noetl_dagster.engine.events import uuid7

    execution_id = uuid7()
    if not detach:  # this process exists for the execution: its start-up is the execution's platform usage
        from noetl_dagster.engine.usage import charge_process_start

        charge_process_start()
    if runner == "dagster":
        from noetl_dagster.translator.runner import DetachTargetMissing, run_with_dagster

        try:
            with _execution_lease(event_store, data_dir, None if detach else execution_id):
                result = run_with_dagster(
                    pb, overrides, event_store=event_store, data_dir=data_dir, catalog_dirs=catalog_dirs,
                    tenant=tenant, project=project, mode=mode, detach=detach, execution_id=execution_id,
                )  # fmt: skip
        except DetachTargetMissing as e:
            _fail_input(str(e))
    elif durable:  # every step a commit into the event store (before issue 46, the default)
        from noetl_dagster.runners.local import run_playbook

        with _execution_lease(event_store, data_dir, execution_id):
            result = run_playbook(
                pb, overrides, event_store=event_store, data_dir=data_dir, catalog_dirs=catalog_dirs,
                tenant=tenant, project=project, on_step=progress.on_step, logger=lambda m: None,
                execution_id=execution_id, durable=True,
            )  # fmt: skip
    else:  # the local mode (seed 004 H.11): Arrow batches under <data dir>/local/<execution_id>/
        from noetl_dagster.commands.push import run_local

        result = run_local(
            pb, overrides, event_store=event_store, data_dir=data_dir, catalog_dirs=catalog_dirs, tenant=tenant,
            project=project, on_step=progress.on_step, execution_id=execution_id, offline=offline,
        )  # fmt: skip
    if as_json:
        out = result.to_json()
        if result.extra.get("dagster"):  # the Dagster runs that drove it (the job's run first) and the cost
            # (the local runner's --json stays without it: pricing reads the YAML price file, and a cached
            # local run imports no YAML parser; `explain --json` prices it)
            runs = result.extra["dagster"]
            out["dagster"] = {"run_id": runs["run_ids"][0] if runs["run_ids"] else None, **runs}
            out["cost"] = _cost_json(result.execution_id, event_store, data_dir)
        click.echo(dumps(out))
    elif result.extra.get("follow"):  # detached: the request id and how to follow it, no empty table
        click.echo(result.extra["follow"])
    else:
        _print_summary(result)
    if result.extra.get("error"):  # the engine ended it (a crash, a limit): one line on stderr
        click.echo(
            f"error: execution {result.execution_id} failed: {result.extra['error'].get('message')}", err=True
        )
    sys.exit(EXIT_OK if result.status in ("completed", "requested") else EXIT_FAILED)


def _cost_json(execution_id: str, event_store: str | None, data_dir: str | None) -> dict[str, Any]:
    """The execution's cost for ``run --json``: every line of its log priced by the price table
    the Dagster run tags and ``facts refresh`` use (a price file that does not load: ``error``)."""
    from noetl_analytics.pricing import COMPONENTS, Cost, PriceConfigError, PriceTable, cost_of_events

    try:
        prices = PriceTable.load(data_dir=data_dir)
    except PriceConfigError as e:
        return {"error": str(e)}
    store = _open_store(event_store, data_dir)
    try:
        events = [e for e in store.read(execution_id) if e.execution_id == execution_id]
    finally:
        store.close()
    by_step = cost_of_events(prices, events)
    total = sum(by_step.values(), Cost(currency=prices.currency))
    return {
        "currency": prices.currency,
        "total": total.total,
        **{c: getattr(total, c) for c in COMPONENTS if getattr(total, c)},
        "steps": {s: c.total for s, c in sorted(by_step.items()) if s},
        "price_version": total.price_version,
        "price_fingerprint": prices.fingerprint(),
    }


@contextmanager
def _execution_lease(
    event_store: str | None, data_dir: str | None, execution_id: str | None
) -> Iterator[None]:
    """`run` holds its execution's lease while it runs, as `resume` does (issue 14.7): a `resume`
    of a running execution is refused instead of running it a second time. The lease lives on a
    store connection of its own; a detached run (nothing runs here) takes none."""
    if execution_id is None:
        yield
        return
    store = _open_store(event_store, data_dir)
    try:
        store.acquire_lease(execution_id)
        yield
    finally:
        store.close()  # releases the lease


# A summary of more steps than this shows the first and last SUMMARY_EDGE and every failed one,
# each stretch of hidden steps as one "... N more steps" row with their runs (the rich table cost
# ~0.2 ms a row; all steps: noetl-dagster events ID or run --json)
SUMMARY_MAX_ROWS = 50
SUMMARY_EDGE = 20


def _summary_rows(result: Any) -> list[tuple[str, str, str]]:
    """(step, runs, result) rows of the summary table, collapsed for long runs."""
    steps = list(result.runs.items())

    def failed(step: str) -> bool:
        r = result.results.get(step)
        return isinstance(r, dict) and r.get("status") == "error"

    if len(steps) <= SUMMARY_MAX_ROWS:
        shown = set(range(len(steps)))
    else:
        last = len(steps) - SUMMARY_EDGE
        shown = {i for i, (step, _) in enumerate(steps) if i < SUMMARY_EDGE or i >= last or failed(step)}
    rows: list[tuple[str, str, str]] = []
    hidden, hidden_runs = 0, 0
    for i, (step, n) in enumerate(steps):
        if i not in shown:
            hidden, hidden_runs = hidden + 1, hidden_runs + n
            continue
        if hidden:
            rows.append((f"... {hidden} more steps", str(hidden_runs), ""))
            hidden, hidden_runs = 0, 0
        text = dumps(result.results.get(step))
        rows.append((step, str(n), text if len(text) <= 100 else text[:97] + "..."))
    return rows


def _print_summary(result: Any) -> None:
    rows = _summary_rows(result)
    if not (is_plain(sys.stdout) and _print_plain_summary(result, rows)):
        _print_rich_summary(result, rows)


def _print_rich_summary(result: Any, rows: list[tuple[str, str, str]]) -> None:
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    # names and results are the user's text: Text objects, never markup or emoji codes
    console = Console()
    color = "green" if result.status == "completed" else "red"
    console.print(
        Text.assemble(
            (str(result.playbook), "bold"),
            "  execution ",
            (str(result.execution_id), "cyan"),
            "  ",
            (str(result.status), color),
        )
    )
    table = Table(show_header=True, header_style="bold")
    table.add_column("step")
    table.add_column("runs", justify="right")
    table.add_column("result", overflow="fold")
    for step, n, text in rows:
        table.add_row(Text(step), Text(n), Text(text), style=None if text else "dim")  # a result is never ""
    console.print(table)
    console.print(Text(f"event log: {result.event_store_url}  (noetl-dagster events {result.execution_id})"))


def _print_plain_summary(result: Any, rows: list[tuple[str, str, str]]) -> bool:
    """The summary as rich prints it to a non-terminal, without rich; False when only rich can say."""
    width = console_width()
    head = text_lines(f"{result.playbook}  execution {result.execution_id}  {result.status}", width)
    body = plain_table(["step", "runs", "result"], rows, {1}, width)
    tail = text_lines(
        f"event log: {result.event_store_url}  (noetl-dagster events {result.execution_id})", width
    )
    if head is None or body is None or tail is None:
        return False
    sys.stdout.write("\n".join([*head, *body, *tail]) + "\n")
    return True


def _open_store(event_store: str | None, data_dir: str | None) -> Any:
    from noetl_dagster.storage.event_stores import open_event_store

    return open_event_store(event_store, data_dir=data_dir)


@click.command()
@click.argument("execution_id", required=False)
@click.option(
    "--from-archive",
    "archive_uri",
    help="Rebuild from an execution archive bundle instead of the event store.",
)
@click.option(
    "--bodies", is_flag=True, help="Fetch stored payloads (verified) into the output instead of summaries."
)
@click.option(
    "--max-body-bytes",
    type=click.IntRange(min=0),
    default=None,
    help="With --bodies: the largest payload fetched (default 16 MiB); bigger ones stay references.",
)
@click.option("--event-store")
@click.option("--data-dir", type=click.Path(file_okay=False))
@click.option("--json", "as_json", is_flag=True)
def replay(execution_id: str | None, archive_uri: str | None, bodies: bool, max_body_bytes: int | None,
           event_store: str | None, data_dir: str | None, as_json: bool) -> None:  # fmt: skip
    """Rebuild an execution's final state from its events alone.

    Every stored reference is resolved through the payload adapter registry (file, s3, gs, azure)
    and summed up (checksum, size, rows, JSON shape, status); --bodies puts the payloads in."""
    from noetl_dagster.storage.resolve import DEFAULT_BODY_LIMIT, RefResolver  # noqa: PLC0415

    limit = DEFAULT_BODY_LIMIT if max_body_bytes is None else max_body_bytes
    if archive_uri:
        try:
            from noetl_dagster.storage.archive import replay_from_archive
        except ImportError:
            _fail_input("execution archives are not available in this installation")
        report = replay_from_archive(archive_uri, bodies=bodies, body_limit=limit)
        click.echo(dumps(report) if as_json else json.dumps(report, indent=2, default=str))
        sys.exit(EXIT_OK if report.get("match", True) else EXIT_FAILED)
    if not execution_id:
        _fail_input("give an EXECUTION_ID or --from-archive URI")
    from noetl_dagster.engine.replay import replay as do_replay
    from noetl_dagster.runners.local import build_services
    from noetl_dagster.storage.payload import iter_refs  # noqa: PLC0415

    svc = build_services(event_store=event_store, data_dir=data_dir)
    try:  # an altered log is refused with its first bad sequence (ChainBroken: one line, exit 1)
        state = do_replay(svc.event_store, execution_id, None)  # references stay references
    except KeyError as e:
        _fail_input(str(e.args[0]))
    results = {s: state.result(s) for s in state.results}
    ctx = state.ctx
    refs = list(iter_refs([results, ctx]))
    registry = None
    reader = state.reader  # the execution's tenant and project: what its references are read as
    if any(r.uri.startswith("noetl://") for r in refs):  # resolved through the resource catalog
        from noetl_registry.client import open_registry  # noqa: PLC0415

        first = svc.event_store.read(execution_id)[0]
        registry = open_registry(None, tenant=first.tenant_id, project=first.project_id)
    resolver = RefResolver(svc.offloader.store, bodies=bodies, body_limit=limit, registry=registry,
                           reader=reader, locator=svc.offloader.locator)  # fmt: skip
    if bodies:
        results, ctx = resolver.resolve_value(results), resolver.resolve_value(ctx)
    out = {
        "execution_id": execution_id,
        "status": state.status,
        "ctx": ctx,
        "results": results,
        "runs": state.runs,
        "pending_tokens": [{"token_id": t.token_id, "step": t.step} for t in state.tokens.values()],
        "loops": {k: v.snapshot() for k, v in state.loops.items()},
        "references": RefResolver(
            svc.offloader.store, registry=registry, reader=reader, locator=svc.offloader.locator
        ).summarize_all(refs),
    }
    click.echo(dumps(out) if as_json else json.dumps(out, indent=2, default=str))


@click.command()
@click.argument("execution_id")
@click.option("--event-store")
@click.option("--data-dir", type=click.Path(file_okay=False))
@click.option("--json", "as_json", is_flag=True, help="One JSON event per line.")
def events(execution_id: str, event_store: str | None, data_dir: str | None, as_json: bool) -> None:
    """Print an execution's event log."""
    store = _open_store(event_store, data_dir)
    evs = store.read(execution_id)
    if not evs:
        _fail_input(f"no events for execution {execution_id} in {store.url}")
    for ev in evs:
        if as_json:
            click.echo(dumps(ev.to_dict()))
        else:
            where = ".".join(
                str(x) for x in (ev.step, ev.data.get("task") if isinstance(ev.data, dict) else None) if x
            )
            it = f"[{ev.iteration}]" if ev.iteration is not None else ""
            click.echo(f"{ev.sequence:>5} {ev.timestamp[11:23]} {ev.name:<26} {ev.status:<11} {where}{it}")


@click.command()
@click.option("--event-store")
@click.option("--data-dir", type=click.Path(file_okay=False))
@click.option("--limit", default=20, show_default=True, type=click.IntRange(1, 100_000))
@click.option("--json", "as_json", is_flag=True)
def executions(event_store: str | None, data_dir: str | None, limit: int, as_json: bool) -> None:
    """List recent executions in the event store."""
    store = _open_store(event_store, data_dir)
    rows = store.executions(limit)
    if as_json:
        click.echo(dumps([r.__dict__ for r in rows]))
        return
    for r in rows:
        click.echo(
            f"{r.execution_id}  {r.status:<10} {r.events:>6} events  {r.started_at or '':<32} {r.playbook or ''}"
        )
