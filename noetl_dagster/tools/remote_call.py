"""A tool call made in another process: the reply both ends agree on (the sandbox worker, the pool).

The process that runs the kind (``tools/sandbox_worker.py``'s child, ``runners/pool_worker.py``)
turns the call into a reply with :func:`call_as_reply` over a :class:`RemoteContext`; the engine's
side turns the reply back into the call's own ending with :func:`reply_outcome`: the tool's logs,
notes and secrets handed to the task's context, then the result or the ToolError the kind raised.
The reply is JSON data from another process (the tenant's code may have run there): each field is
checked before it is used.
"""

from __future__ import annotations

import traceback
from collections.abc import Callable, Mapping
from typing import Any

from noetl_dagster.tools.registry import ToolError

MAX_LOG_LINES, MAX_LOG_CHARS = 10_000, 16_384
NOTE_KEYS = frozenset({"sql", "sql_namespace", "sql_default_schema", "sql_dialect"})  # ctx.note of the kinds


class RemoteContext:
    """The ToolContext parts every remote call has: what the tool logs, notes and marks secret is kept
    for the reply; resources live as long as the context (``close``)."""

    def __init__(self, resources: dict[str, Any] | None = None):
        self._resources = resources if resources is not None else {}
        self.logs: list[str] = []
        self.notes: dict[str, Any] = {}
        self.redactions: list[str] = []

    def resource(self, key: str, factory: Callable[[], Any]) -> Any:
        if key not in self._resources:
            self._resources[key] = factory()
        return self._resources[key]

    def log(self, message: str) -> None:
        self.logs.append(str(message))

    def redact(self, value: str) -> None:
        self.redactions.append(str(value))

    def note(self, **meta: Any) -> None:
        self.notes.update(meta)

    def close(self) -> None:
        for r in self._resources.values():
            close = getattr(r, "close", None)
            if callable(close):
                try:
                    close()
                except Exception:  # noqa: BLE001, S110 - ending anyway
                    pass
        self._resources.clear()


def call_as_reply(
    tool: Any,
    config: Mapping[str, Any],
    ctx: RemoteContext,
    missing: str = "this tool kind does not run here",
) -> dict[str, Any]:
    """Run ``tool`` (a kind from dsl.kinds; None: it does not run here, ``missing`` says why) and say how
    it ended, as the engine's own call would: ``ok`` and ``result``, or ``error`` (kind, message,
    retryable, code, details, result); then ``logs``, ``notes`` and ``redact``."""
    from noetl_dagster.dsl.kinds import KindError  # noqa: PLC0415
    from noetl_dagster.util.jsonutil import plain  # noqa: PLC0415

    out: dict[str, Any]
    try:
        if tool is None:
            raise ToolError(missing, kind="unknown_kind")
        out = {"ok": True, "result": plain(tool.invoke(dict(config), ctx))}
    except KindError as e:
        out = {"ok": False, "error": {"kind": e.kind, "message": str(e)}}
    except ToolError as e:
        out = {"ok": False, "error": {"kind": e.kind, "message": str(e.message), "retryable": e.retryable,
                                      "code": e.code, "details": plain(e.details), "result": plain(e.result)}}  # fmt: skip
    except Exception as e:  # noqa: BLE001 - a tool bug is an error outcome, as in the engine's process
        py = {"exception_type": type(e).__name__, "traceback": traceback.format_exc(limit=-8)[-16384:]}
        out = {"ok": False, "error": {"kind": "exception", "message": f"{type(e).__name__}: {e}",
                                      "details": {"py": py}}}  # fmt: skip
    out.update(logs=ctx.logs, notes=ctx.notes, redact=ctx.redactions)
    return out


def reply_outcome(
    reply: Mapping[str, Any],
    ctx: Any,
    *,
    detail_keys: frozenset[str],
    adopt: Callable[[Any], Any] = lambda value: value,
    default_message: str = "the task failed in another process",
) -> Any:
    """The call's ending from its reply: logs, secrets and notes to ``ctx``; the result (through
    ``adopt``), or the ToolError, with only ``detail_keys`` of its kind helpers."""
    for line in (reply.get("logs") or ())[:MAX_LOG_LINES]:
        ctx.log(str(line)[:MAX_LOG_CHARS])
    for value in reply.get("redact") or ():
        ctx.redact(str(value))
    notes = reply.get("notes")
    if isinstance(notes, dict) and callable(getattr(ctx, "note", None)):
        ctx.note(**{k: v for k, v in notes.items() if k in NOTE_KEYS})  # never the meta's own keys
    if reply.get("ok"):
        return adopt(reply.get("result"))
    e = reply.get("error") if isinstance(reply.get("error"), dict) else {}
    details = e.get("details") if isinstance(e.get("details"), dict) else {}
    code = e.get("code")
    raise ToolError(str(e.get("message") or default_message), kind=str(e.get("kind") or "tool_error"),
                    retryable=e.get("retryable") is True, code=code if isinstance(code, (str, int)) else None,
                    details={k: v for k, v in details.items() if k in detail_keys},
                    result=adopt(e.get("result")))  # fmt: skip
