"""Core tool kinds: python, noop, workbook, playbook (SEMANTICS.md §6)."""

from __future__ import annotations

import builtins
import inspect
import json
import os
import sys
import textwrap
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from noetl_dagster.dsl.source import YamlLimits, YamlSyntaxError
from noetl_dagster.dsl.template_front import TemplateError
from noetl_dagster.tools.registry import ToolContext, ToolError, register_tool
from noetl_dagster.util.files import InputFileError, read_bounded_text

_CODE_CACHE: dict[str, Any] = {}
_CODE_LOCK = threading.Lock()
_RESERVED = {"code", "code_b64", "code_base64", "script", "libs", "deps", "input", "args", "name"}
STDOUT_LIMIT = 8192


# configs by reference: defined (pydantic) at the first call that validates one, never for noop (issue 35)
_CONFIGS = "noetl_dagster.tools.configs:"


@register_tool(
    "noop",
    config=_CONFIGS + "NoopConfig",
    plain_config=frozenset(),
    description="Does nothing; returns {status: noop} (or its `result` input).",
)
def noop_tool(inputs: dict[str, Any], ctx: ToolContext) -> Any:
    if "result" in inputs:
        return inputs["result"]
    return {"status": "noop"}


@register_tool(
    "workbook",
    config=_CONFIGS + "WorkbookConfig",
    plain_config=frozenset({"name"}),
    description="Runs the named `workbook` entry's tool with the merged input.",
)
def workbook_tool(inputs: dict[str, Any], ctx: ToolContext) -> Any:
    name = inputs.get("name")
    if not name:
        raise ToolError("`kind: workbook` needs `name`", kind="config_error")
    return ctx.run_workbook(str(name), inputs)  # type: ignore[attr-defined]


@register_tool(
    "playbook",
    config=_CONFIGS + "PlaybookConfig",
    raw_keys={"definition"},
    description="Runs a sub-playbook (a catalog `path` or an inline `definition`); returns its return_step result.",
)
def playbook_tool(inputs: dict[str, Any], ctx: ToolContext) -> Any:
    path = inputs.get("path") or inputs.get("catalog_path")
    definition = inputs.get("definition")
    if definition is not None and path:
        raise ToolError("`kind: playbook` takes `path` or `definition`, not both", kind="config_error")
    if not path and definition is None:
        raise ToolError("`kind: playbook` needs `path` (a catalog playbook) or `definition` (an inline one)",
                        kind="config_error")  # fmt: skip
    workload = inputs.get("input")
    if workload is None:
        workload = inputs.get("payload", inputs.get("args", {}))
    if not isinstance(workload, Mapping):
        raise ToolError(
            "`kind: playbook` input must be a mapping (the child's workload)", kind="config_error"
        )
    return_step = inputs.get("return_step") or inputs.get("result_step")
    if definition is None:
        return ctx.run_playbook(str(path), dict(workload), return_step=return_step)
    credentials = inputs.get("credentials") or []
    if isinstance(credentials, str):
        credentials = [credentials]
    if not isinstance(credentials, list) or not all(isinstance(c, str) for c in credentials):
        raise ToolError("`credentials` must be a list of keychain names", kind="config_error")
    pb = generated_playbook(definition, ctx)
    registry = inputs.get("registry") or os.environ.get("NOETL_REGISTRY_URL")
    try:
        out = ctx.run_playbook(
            "", dict(workload), return_step=return_step, definition=pb, credentials=credentials
        )
    except ToolError as e:
        if registry and e.kind == "playbook_failed" and isinstance(e.result, Mapping):
            _register_ephemeral(registry, inputs, pb, e.result, ctx)
        raise
    if registry:
        _register_ephemeral(registry, inputs, pb, out, ctx)
    return out


EPHEMERAL_DEFINITION_LIMIT = 48 << 10  # bytes of canonical YAML kept in the registry row's metadata


def _register_ephemeral(
    registry: str, inputs: Mapping[str, Any], pb: Any, out: Mapping[str, Any], ctx: ToolContext
) -> None:
    """A ``kind: ephemeral_playbook`` catalog row for a generated child, when a registry is configured
    for the execution (the task's ``registry:`` or ``$NOETL_REGISTRY_URL``). Registry trouble is logged,
    never fails the step: the definition is on the child's request event either way."""
    from noetl_dagster.dsl.builder import canonical_yaml, playbook_id
    from noetl_dagster.dsl.locator import ResourceLocator
    from noetl_registry.client import open_registry

    pid = playbook_id(pb)
    text = canonical_yaml(pb)
    tenant, project = getattr(ctx, "tenant", None) or "default", getattr(ctx, "project", None) or "default"
    meta: dict[str, Any] = {"playbook_id": pid, "name": pb.metadata.name, "path": pb.metadata.path,
                            "parent_execution_id": ctx.execution_id, "status": out.get("status", "completed")}  # fmt: skip
    if len(text.encode()) <= EPHEMERAL_DEFINITION_LIMIT:
        meta["definition"] = text
    try:
        uri = ResourceLocator(
            tenant, project, "playbooks", "ephemeral_playbook", pid.split(":", 1)[1][:32]
        ).uri
        client = open_registry(str(registry), inputs.get("api_key") or None, tenant=tenant, project=project)
        client.register(uri, kind="ephemeral_playbook", metadata=meta, execution_id=out.get("execution_id"),
                        step=ctx.step, task=ctx.task)  # fmt: skip
    except Exception as e:  # noqa: BLE001 - the catalog row is a convenience; the event log is the record
        ctx.log(f"ephemeral playbook {pid} not registered: {type(e).__name__}: {e}")


def generated_playbook(definition: Any, ctx: ToolContext) -> Any:
    """An inline definition -> a validated Playbook: a mapping (as written, or produced by an earlier
    step), YAML text, or a template (``{{ steps.plan.result }}``) rendering to either. Its own
    templates are not rendered here: they belong to the child execution."""
    value = definition
    if isinstance(value, str) and ("{{" in value or "{%" in value) and value.strip().startswith(("{{", "{%")):
        from noetl_dagster.dsl.templates import template_env  # noqa: PLC0415 - Jinja2 at the first template (issue 35)

        try:
            value = template_env().render(value, ctx.render_context)
        except TemplateError as e:
            raise ToolError(f"`definition` template failed: {e}", kind="template_error") from None
    from noetl_dagster.dsl.files import check_playbook_size  # noqa: PLC0415 - the parser: generated playbooks only
    from noetl_dagster.dsl.loader import load_yaml_text  # noqa: PLC0415 - PyYAML likewise (issue 35)

    source = None
    if isinstance(value, str):
        try:
            value, source = load_yaml_text(value, "<generated>")
        except YamlSyntaxError as e:
            raise ToolError(f"generated playbook is invalid: {e.line}: {e.rule}: {e.message}",
                            kind="generated_playbook_invalid", result={"issues": [f"{e.line}: {e.rule}: {e.message}"]}) from None  # fmt: skip
    if isinstance(value, Mapping) and "$ref" in value and hasattr(ctx, "offloader"):
        value = ctx.offloader.resolve(value, (ctx.tenant, ctx.project))  # type: ignore[attr-defined] - a big result kept by reference
    if not isinstance(value, Mapping):
        raise ToolError(f"`definition` must be a playbook mapping or YAML text, not {type(value).__name__}",
                        kind="generated_playbook_invalid", result={"issues": ["not-a-playbook"]})  # fmt: skip
    raw = _plain(value)
    issues = check_playbook_size(raw, "<generated>")
    pb = None
    if not issues:
        from noetl_dagster.dsl.parse import parse_playbook  # noqa: PLC0415 - the parser: generated playbooks only (issue 35)

        pb, issues = parse_playbook(raw, source_map=source, source_file=None)
    if issues:
        lines = [
            f"{i.rule}: {i.path + ': ' if i.path and i.path != '<root>' else ''}{i.message}" for i in issues
        ]
        raise ToolError("generated playbook is invalid: " + "; ".join(lines), kind="generated_playbook_invalid",
                        result={"issues": lines})  # fmt: skip
    return pb


def _plain(value: Any) -> Any:
    """Mappings/sequences from a template scope (read-only views) -> plain dicts and lists."""
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


# -- python ---------------------------------------------------------------------


def _coerce(value: Any) -> Any:
    """JSON-looking strings become values (as the reference engine does for python inputs)."""
    if isinstance(value, str):
        s = value.strip()
        if s[:1] in "[{" and s[-1:] in "]}":
            try:
                return json.loads(s)
            except ValueError:
                return value
    return value


def _source(inputs: dict[str, Any], ctx: ToolContext) -> str:
    code = inputs.get("code")
    if type(code) is str:
        return code
    for key in ("code_b64", "code_base64"):
        if isinstance(inputs.get(key), str):
            from base64 import b64decode  # noqa: PLC0415 - base64 code only, not a run's start-up

            try:
                return b64decode(inputs[key]).decode()
            except Exception as e:  # noqa: BLE001
                raise ToolError(f"`{key}` is not valid base64 text: {e}", kind="config_error") from None
    script = inputs.get("script")
    if script:
        if isinstance(script, Mapping):
            src = script.get("source") or {}
            if isinstance(src, Mapping) and (src.get("type") == "inline" or script.get("uri") == "inline"):
                code = src.get("code") or script.get("code")
                if not isinstance(code, str):
                    raise ToolError("an inline `script` needs `source.code`", kind="config_error")
                return code
            path = (
                script.get("path")
                or script.get("uri")
                or (src.get("path") if isinstance(src, Mapping) else None)
            )
        else:
            path = str(script)
        if not path:
            raise ToolError("`script` needs a path", kind="config_error")
        p = Path(str(path).removeprefix("file://"))
        if not p.is_absolute() and ctx.base_dir:
            p = Path(ctx.base_dir) / p
        try:  # the bounded reader: a regular file within the playbook size limit (a FIFO would hang the run)
            return read_bounded_text(p, YamlLimits.from_env().max_bytes, what="script")
        except InputFileError as e:
            raise ToolError(f"cannot read script {e}", kind="config_error") from None
    raise ToolError("`kind: python` needs `code`, `code_b64` or `script`", kind="config_error")


def _compile(source: str) -> tuple[Any, bool]:
    """(code object, wrapped) — code whose top level returns is wrapped in a function."""
    hit = _CODE_CACHE.get(source)  # a dict read is atomic; the lock only guards writes
    if hit is not None:
        return hit
    try:
        compiled = (compile(source, "<noetl-python>", "exec"), False)
    except SyntaxError as e:
        if "'return' outside function" not in str(e):
            raise ToolError(f"python syntax error at line {e.lineno}: {e.msg}", kind="python_syntax",
                            details={"py": {"exception_type": "SyntaxError"}}) from None  # fmt: skip
        wrapped = (
            "def __noetl_step__():\n"
            + textwrap.indent(source, "    ")
            + "\n__noetl_result__ = __noetl_step__()\n"
        )
        try:
            compiled = (compile(wrapped, "<noetl-python>", "exec"), True)
        except SyntaxError as e2:
            raise ToolError(f"python syntax error at line {e2.lineno}: {e2.msg}", kind="python_syntax",
                            details={"py": {"exception_type": "SyntaxError"}}) from None  # fmt: skip
    with _CODE_LOCK:
        if len(_CODE_CACHE) > 4096:
            _CODE_CACHE.clear()
        _CODE_CACHE[source] = compiled
    return compiled


def _inputs(inputs: dict[str, Any]) -> dict[str, Any]:
    """The code's variables. Values are the rendered config's own objects, not copies: rendering
    made them (templates.render copies what it reads from ctx or results), and nothing else holds them."""
    data: dict[str, Any] = {}
    for key in ("args", "input"):
        v = inputs.get(key)
        if v is not None and (type(v) is dict or isinstance(v, Mapping)):
            data.update(v)
    for k, v in inputs.items():  # keys written beside `code` are inputs too
        if k not in _RESERVED and k not in data:
            data[k] = v
    for k, v in data.items():
        if type(v) is str:
            data[k] = _coerce(v)
    return data


def _call_main(fn: Any, data: dict[str, Any], context: Any) -> Any:
    sig = inspect.signature(fn)
    kwargs: dict[str, Any] = {}
    takes_var_kw = any(p.kind is p.VAR_KEYWORD for p in sig.parameters.values())
    for name, p in sig.parameters.items():
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        if name in data:
            kwargs[name] = data[name]
        elif name in ("input_data", "data"):
            kwargs[name] = data
        elif name == "context":
            kwargs[name] = context
    if takes_var_kw:
        for k, v in data.items():
            kwargs.setdefault(k, v)
    result = fn(**kwargs)
    if inspect.iscoroutine(result):
        import asyncio  # noqa: PLC0415 - ~15 ms, only for an async main()

        result = asyncio.run(result)
    return result


def _check_result(result: Any) -> Any:
    if result is None or (type(result) is dict and "status" not in result):
        return result
    if isinstance(result, Mapping) and str(result.get("status", "")).lower() == "error":
        msg = result.get("error") or result.get("message") or "python code returned status: error"
        raise ToolError(str(msg if not isinstance(msg, Mapping) else msg.get("message", msg)), kind="python_error",
                        result=dict(result))  # fmt: skip
    return result


_BASE_GLOBALS: dict[str, Any] = {}


def _base_globals() -> dict[str, Any]:
    """The names every python task sees besides its inputs (modules, not state: copying the dict
    per call shares the module objects, as a fresh import would)."""
    if not _BASE_GLOBALS:
        import datetime
        import uuid

        _BASE_GLOBALS.update({"__name__": "__noetl__", "__builtins__": builtins, "json": json, "os": os,
                              "result": None, "datetime": datetime, "uuid": uuid})  # fmt: skip
    return _BASE_GLOBALS


def run_python_inline(source: str, data: dict[str, Any], context: Any, log: Any = None) -> Any:
    code, wrapped = _compile(source)
    out: list[str] = []

    def _print(*args: Any, sep: str = " ", end: str = "\n", file: Any = None, flush: bool = False) -> None:
        if file is not None and file not in (sys.stdout, sys.stderr):
            builtins.print(*args, sep=sep, end=end, file=file, flush=flush)
            return
        text = sep.join(str(a) for a in args) + end
        out.append(text)
        if log is not None:
            log(text.rstrip("\n"))

    g = _base_globals().copy()  # a fresh namespace per call: nothing a task defines reaches the next
    g["print"] = _print
    g["input_data"] = data
    g["context"] = context
    g.update(data)
    try:
        exec(code, g)  # noqa: S102 - running playbook code is this tool's purpose
        if wrapped:
            result = g.get("__noetl_result__")
        else:
            result = g.get("result")
            if result is None and callable(g.get("main")):
                result = _call_main(g["main"], data, context)
    except ToolError:
        raise
    except Exception as e:  # noqa: BLE001 - user code: any exception is an error outcome
        import traceback

        tb = traceback.format_exc(limit=6)
        raise ToolError(
            f"{type(e).__name__}: {e}",
            kind="python_exception",
            retryable=False,
            details={
                "py": {
                    "exception_type": type(e).__name__,
                    "traceback": tb,
                    "stdout": "".join(out)[-STDOUT_LIMIT:],
                }
            },
        ) from None
    return _check_result(result)


_SUBPROCESS_RUNNER = r"""
import json, sys
from noetl_dagster.tools.core import run_python_inline
from noetl_dagster.tools.registry import ToolError
req = json.load(sys.stdin)
try:
    res = run_python_inline(req["source"], req["data"], req["context"])
    out = {"ok": True, "result": res}
except ToolError as e:
    out = {"ok": False, "message": e.message, "kind": e.kind, "details": e.details, "result": e.result}
text = json.dumps(out, default=str)
try:  # this child's own peak RSS for the parent's meter (its ru_maxrss starts at the parent's)
    from noetl_dagster.engine.usage import own_hwm
    hwm = own_hwm()
except Exception:
    hwm = 0
sys.stdout.write("\n__NOETL_HWM__%d\n__NOETL_RESULT__" % hwm + text)
"""


def _run_python_process(
    source: str,
    data: dict[str, Any],
    context: dict[str, Any],
    timeout: float,
    log: Any,
    env: dict[str, str] | None = None,
    cwd: str | None = None,
    confine: Callable[[list[str]], Any] | None = None,
) -> Any:
    import subprocess  # noqa: PLC0415 - isolated python only (issue 35: a run imports no subprocess)

    from noetl_dagster.engine.usage import Popen, peak  # the child's peak RSS is the attempt's
    from noetl_dagster.util.jsonutil import dumps

    argv = [sys.executable, "-c", _SUBPROCESS_RUNNER]
    if confine is not None:  # the OS sandbox (tools/sandbox.py): its own argv, environment and cwd
        box = confine(argv)
        argv, env, cwd = box.argv, box.env, box.cwd
    with Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
               env=env, cwd=cwd) as popen:  # fmt: skip
        try:
            out, err = popen.communicate(
                dumps({"source": source, "data": data, "context": context}), timeout=timeout
            )
        except subprocess.TimeoutExpired:
            popen.kill()
            popen.communicate()
            raise ToolError(f"python process timed out after {timeout:g}s", kind="timeout", retryable=True,
                            details={"py": {"exception_type": "TimeoutExpired"}}) from None  # fmt: skip
    proc = subprocess.CompletedProcess(popen.args, popen.returncode, out, err)
    stdout, _, payload = proc.stdout.rpartition("\n__NOETL_RESULT__")
    if payload:
        stdout, _, hwm = stdout.rpartition("\n__NOETL_HWM__")
        if hwm.isdigit():  # the child's own peak RSS (its kernel mark would start at ours)
            peak(child_maxrss_bytes=int(hwm))
    if log and stdout.strip():
        log(stdout.strip())
    if not payload:
        raise ToolError(
            f"python process exited with code {proc.returncode}: {proc.stderr.strip()[-500:]}",
            kind="python_process",
            details={"py": {"exception_type": "ProcessError", "stderr": proc.stderr[-STDOUT_LIMIT:]}},
        )
    out = json.loads(payload)
    if out["ok"]:
        return out["result"]
    raise ToolError(
        out["message"], kind=out["kind"], details=out.get("details") or {}, result=out.get("result")
    )


def _import_libs(libs: Any) -> dict[str, Any]:
    """``libs``: ``{alias: module}``, ``{alias: {from: module, import: name}}`` or a list of modules / such mappings."""
    import importlib

    items: list[tuple[str | None, Any]]
    if isinstance(libs, Mapping):
        items = list(libs.items())
    elif isinstance(libs, list):
        items = [(None, x) for x in libs]
    else:
        raise ToolError("`libs` must be a mapping of alias -> module, or a list", kind="config_error")
    out: dict[str, Any] = {}
    for alias, spec in items:
        try:
            if isinstance(spec, str):
                out[alias or spec.split(".")[0]] = importlib.import_module(
                    spec if alias else spec.split(".")[0]
                )
            elif isinstance(spec, Mapping) and spec.get("from"):
                name = str(spec.get("import") or alias)
                out[str(alias or spec.get("as") or name)] = getattr(
                    importlib.import_module(str(spec["from"])), name
                )
            elif isinstance(spec, Mapping) and spec.get("import"):
                mod = str(spec["import"])
                out[str(alias or spec.get("as") or mod.split(".")[0])] = importlib.import_module(mod)
            else:
                raise ToolError(f"libs: cannot read {spec!r}", kind="config_error")
        except (ImportError, AttributeError) as e:
            raise ToolError(f"libs: cannot import {spec!r}: {e}", kind="config_error") from None
    return out


@register_tool(
    "python",
    config=_CONFIGS + "PythonConfig",
    plain_config=frozenset({"code", "code_b64", "code_base64"}),
    raw_keys={"code", "code_b64", "code_base64"},
    description="Runs Python code: inputs are globals; result is `result`, main(...)'s return, or a top-level return.",
)
def python_tool(inputs: dict[str, Any], ctx: ToolContext) -> Any:
    source = _source(inputs, ctx)
    data = _inputs(inputs)
    libs = inputs.get("libs")
    if libs:
        data.update({k: v for k, v in _import_libs(libs).items() if k not in data})
    spec = ctx.spec or {}
    from noetl_dagster.tools import sandbox  # noqa: PLC0415

    boxed = sandbox.wanted(ctx)
    if spec.get("isolation") == "process" or boxed:
        # a generated playbook's code (and a sandbox policy's) runs in the OS sandbox (tools/sandbox.py):
        # its own uid, filesystem and network, an allowlisted environment, rlimits
        timeout = float(spec.get("timeout") or spec.get("timeout_seconds") or 300)
        scope = ctx.render_context
        plain_ctx = scope.plain() if hasattr(scope, "plain") else {}
        if not boxed:
            return _run_python_process(source, data, plain_ctx, timeout, ctx.log)
        scratch = sandbox.task_scratch(ctx, "python")
        if scratch is not None:
            with sandbox.task_egress(ctx) as proxy:  # the grant's allow_hosts, through the egress proxy
                return _run_python_process(
                    source, data, plain_ctx, timeout, ctx.log,
                    confine=lambda argv: sandbox.task_command(ctx, argv, scratch, proxy_socket=proxy),
                )  # fmt: skip
        # the operator's env-only opt-out: a scrubbed environment and its own directory only
        home = str(ctx.data_dir)
        os.makedirs(home, exist_ok=True)
        return _run_python_process(
            source, data, plain_ctx, timeout, ctx.log, env=sandbox.clean_env(home), cwd=home
        )
    # copy on read, not the live scope: code cannot change engine state without an event (tools/pycontext.py)
    from noetl_dagster.tools.pycontext import CodeContext  # a python task only: not a noop run's import

    return run_python_inline(source, data, CodeContext(ctx.render_context), ctx.log)
