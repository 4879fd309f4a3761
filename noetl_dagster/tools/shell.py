"""``kind: shell`` and ``kind: script``: run commands in the execution's work directory.

``shell`` runs ``cmds`` (a list of shell programs; ``cmd`` / ``command`` for one) with
``/bin/sh -c``, one after the other, stopping at the first non-zero exit (NoETL's contract).
``script`` runs one script — ``script: {path|uri|source}`` or ``code`` — through an
interpreter (by extension: ``.py`` -> this Python, else ``/bin/sh``; or ``interpreter:``).

The sandbox (on by default, ``sandbox: false`` turns it off except for generated playbooks):
the working directory is ``<data dir>/work/<execution_id>`` and ``cwd`` must stay inside it;
the environment is only ``PATH``, ``HOME``/``TMPDIR`` (the work directory) and the declared
``env`` — the worker's own variables (credentials, database URLs) never reach the command.
That alone is not an OS-level jail: the command runs as this user and can read or write any
path that user can by absolute path. Code of a generated playbook (or under a sandbox policy)
runs in the OS sandbox (tools/sandbox.py): the work directory is then its scratch folder.

Result: ``{returncode, stdout, stderr, commands: [{cmd_preview, returncode, stdout, stderr,
duration_ms}], duration_ms, cwd}``. Each stream is capped at ``max_output_bytes`` (64 KiB):
beyond that the result keeps the head and the whole stream goes to the payload store as
``stdout_ref`` / ``stderr_ref`` (a ``$ref`` envelope). A non-zero exit is the error outcome
``kind: exit_code`` with ``code`` = the exit code and the result attached; a timeout is
``kind: timeout`` (retryable), the process group killed.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import Field

from noetl_dagster.engine.usage import Popen
from noetl_dagster.storage.locator import sign_for
from noetl_dagster.storage.payload import FilePayloadStore, PayloadStore, ResultRef, sha256
from noetl_dagster.tools.configs import ToolConfig
from noetl_dagster.tools.registry import ToolContext, ToolError, register_tool

DEFAULT_TIMEOUT = 600.0
DEFAULT_MAX_OUTPUT = 64 * 1024
SHELL_BIN = "/bin/sh"


class ShellConfig(ToolConfig):
    cmds: list[str] | str | None = Field(None, description="shell programs run in order with /bin/sh -c")
    cmd: str | None = Field(None, description="one command (alias of cmds)")
    command: str | None = Field(None, description="one command (alias of cmds)")
    env: dict[str, str | int | float | bool | None] | None = Field(None, description="environment variables")
    cwd: str | None = Field(None, description="working directory, relative to the execution's work directory")
    timeout_seconds: float | None = Field(None, gt=0, description="per-command timeout (default 600)")
    timeout: float | None = Field(None, gt=0, description="alias of timeout_seconds")
    max_output_bytes: int | None = Field(None, ge=0, description="inline cap per stream (default 65536)")
    sandbox: bool = Field(True, description="confine cwd to the work directory and scrub the environment")
    stdin: str | None = Field(None, description="text given to the (first) command on stdin")


class ScriptConfig(ShellConfig):
    script: str | dict[str, Any] | None = Field(
        None, description="a script file, or {path|uri|source: {code}}"
    )
    code: str | None = Field(None, description="the script text (instead of script)")
    interpreter: str | list[str] | None = Field(None, description="e.g. python, bash, [node, --flag]")
    args: list[Any] | None = Field(None, description="arguments given to the script")


# -- sandbox ---------------------------------------------------------------------------------------
def data_dir(ctx: ToolContext) -> Path:
    return Path(getattr(ctx, "data_dir", None) or os.environ.get("NOETL_DAGSTER_HOME", ".noetl"))


def work_dir(ctx: ToolContext, kind: str = "shell") -> Path:
    """The execution's work directory (created on first use); the sandbox's scratch folder when the
    execution's code runs in the OS sandbox (tools/sandbox.py)."""
    scratch = sandbox_scratch(ctx, kind)
    if scratch is not None:
        return Path(scratch)
    path = (data_dir(ctx) / "work" / str(ctx.execution_id)).resolve()
    path.mkdir(parents=True, exist_ok=True)
    return path


def sandbox_scratch(ctx: ToolContext, kind: str) -> str | None:
    from noetl_dagster.tools import sandbox  # noqa: PLC0415

    return sandbox.task_scratch(ctx, kind)


def _cwd(inputs: Mapping[str, Any], ctx: ToolContext, sandbox: bool, kind: str) -> Path:
    base = work_dir(ctx, kind)
    raw = inputs.get("cwd")
    if not raw:
        return base
    path = Path(str(raw)).expanduser()
    path = (path if path.is_absolute() else base / path).resolve()
    if sandbox and path != base and base not in path.parents:
        raise ToolError(
            f"{kind}: cwd {raw!r} is outside the execution's work directory {base} (sandbox; set sandbox: false)",
            kind="config_error",
        )
    if not path.is_dir():
        if sandbox:
            path.mkdir(parents=True, exist_ok=True)
        else:
            raise ToolError(f"{kind}: cwd {raw!r} is not a directory", kind="config_error")
    return path


def _env(inputs: Mapping[str, Any], cwd: Path, sandbox: bool) -> dict[str, str]:
    if sandbox:
        env = {
            "PATH": os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin"),
            "HOME": str(cwd),
            "TMPDIR": str(cwd),
            "LANG": os.environ.get("LANG", "C.UTF-8"),
        }
    else:
        env = dict(os.environ)
    for k, v in (inputs.get("env") or {}).items():
        if v is not None:
            env[str(k)] = str(v).lower() if isinstance(v, bool) else str(v)
    return env


# -- output ----------------------------------------------------------------------------------------
def payload_store(ctx: ToolContext) -> PayloadStore:
    store = getattr(ctx, "payloads", None) or getattr(ctx, "payload_store", None)
    if store is not None:
        return store
    return ctx.resource("payload_store", lambda: FilePayloadStore(data_dir(ctx) / "payloads"))


def store_text(data: bytes, ctx: ToolContext, name: str) -> dict[str, Any]:
    """Bytes into the payload store; the ``$ref`` envelope that reads them back (checksum verified)."""
    store = payload_store(ctx)
    prefix = getattr(getattr(ctx, "offloader", None), "key_prefix", "") or ""
    key = f"{prefix}{ctx.execution_id}/{ctx.step}/{ctx.task}-attempt{ctx.attempt}-{name}.txt"
    uri = store.put_bytes(key, data)
    ref = ResultRef(uri=uri, store=store.name, format="text", size=len(data), checksum=sha256(data))
    return sign_for(ctx, ref, store).envelope()


def _capture(data: bytes, cap: int, ctx: ToolContext, name: str, out: dict[str, Any]) -> None:
    text = data.decode("utf-8", errors="replace")
    if len(data) <= cap:
        out[name] = text
        return
    out[name] = data[:cap].decode("utf-8", errors="ignore")
    out[f"{name}_truncated"] = True
    out[f"{name}_bytes"] = len(data)
    out[f"{name}_ref"] = store_text(data, ctx, name)


# -- running ---------------------------------------------------------------------------------------
def _run_one(
    argv: list[str], *, cwd: Path, env: dict[str, str], timeout: float, stdin: str | None
) -> tuple[int | None, bytes, bytes]:
    """(returncode or None on timeout, stdout, stderr); a timed-out command's process group is killed."""
    proc = Popen(  # noqa: S603 - argv, no shell string splicing; reaped with wait4 (the child's peak RSS)
        argv,
        cwd=str(cwd),
        env=env,
        stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(stdin.encode() if stdin is not None else None, timeout=timeout)
        return proc.returncode, out, err
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # children too (a `sleep` under sh)
        except ProcessLookupError:
            pass
        out, err = proc.communicate()
        return None, out, err


def run_commands(
    programs: list[list[str]], previews: list[str], inputs: Mapping[str, Any], ctx: ToolContext, kind: str
) -> dict[str, Any]:
    sandbox = bool(inputs.get("sandbox", True))
    if not sandbox and getattr(ctx, "restricted", False):
        raise ToolError(f"{kind}: a generated playbook cannot turn the sandbox off", kind="config_error")
    cwd = _cwd(inputs, ctx, sandbox, kind)
    env = _env(inputs, cwd, sandbox)
    scratch = sandbox_scratch(ctx, kind)
    if scratch is None:
        return _run_all(programs, previews, inputs, ctx, kind, cwd, env)
    # the OS sandbox (tools/sandbox.py): its own uid, files, network (the egress proxy), limits
    from noetl_dagster.tools import sandbox as os_sandbox  # noqa: PLC0415

    declared = _env({"env": inputs.get("env")}, cwd, True)  # only the declared env (never the worker's,
    for k in ("PATH", "HOME", "TMPDIR", "LANG"):  # even under `sandbox: false`), the sandbox sets these
        if k not in (inputs.get("env") or {}):
            declared.pop(k, None)
    with os_sandbox.task_egress(ctx) as proxy:
        boxes = [os_sandbox.task_command(ctx, argv, scratch, env=declared, cwd=str(cwd), proxy_socket=proxy)
                 for argv in programs]  # fmt: skip
        if os.geteuid() == 0:  # a cwd made below the scratch folder is the sandbox uid's too
            for p in [cwd, *cwd.parents]:
                if str(p) == scratch or scratch not in str(p):
                    break
                os.chown(p, boxes[0].uid, boxes[0].uid, follow_symlinks=False)
        try:
            return _run_all([b.argv for b in boxes], previews, inputs, ctx, kind, cwd, boxes[0].env)
        except ToolError as e:
            limit = _LIMIT_SIGNALS.get(e.code) if e.kind == "exit_code" and isinstance(e.code, int) else None
            if limit:
                e.message = f"{e.message} [{limit}]"
                e.args = (e.message,)
            raise


# a sandboxed command killed by a signal exits 128 + the signal (bwrap passes it on)
_LIMIT_SIGNALS = {
    128 + signal.SIGKILL: "killed (SIGKILL): the sandbox's CPU-time limit, or its memory",
    128 + signal.SIGXCPU: "SIGXCPU: the sandbox's CPU-time limit (NOETL_SANDBOX_CPU_SECONDS)",
    128 + signal.SIGXFSZ: "SIGXFSZ: the sandbox's file-size limit (NOETL_SANDBOX_FILE_MB)",
}


def _run_all(
    programs: list[list[str]],
    previews: list[str],
    inputs: Mapping[str, Any],
    ctx: ToolContext,
    kind: str,
    cwd: Path,
    env: dict[str, str],
) -> dict[str, Any]:
    timeout = float(inputs.get("timeout_seconds") or inputs.get("timeout") or DEFAULT_TIMEOUT)
    cap = inputs.get("max_output_bytes")
    cap = DEFAULT_MAX_OUTPUT if cap is None else int(cap)
    per: list[dict[str, Any]] = []
    all_out: list[bytes] = []
    all_err: list[bytes] = []
    start = time.monotonic()
    rc: int | None = 0
    failed: str | None = None
    for i, (argv, preview) in enumerate(zip(programs, previews, strict=True)):
        t0 = time.monotonic()
        try:
            rc, out, err = _run_one(
                argv, cwd=cwd, env=env, timeout=timeout, stdin=inputs.get("stdin") if i == 0 else None
            )
        except OSError as e:
            raise ToolError(
                f"{kind}: cannot start {argv[0]!r}: {e.strerror}", kind="exec_error", code=e.errno
            ) from None
        all_out.append(out)
        all_err.append(err)
        entry: dict[str, Any] = {
            "cmd_preview": preview,
            "returncode": -1 if rc is None else rc,
            "duration_ms": int((time.monotonic() - t0) * 1000),
        }
        if len(programs) > 1:
            _capture(out, cap, ctx, "stdout", entry)
            _capture(err, cap, ctx, "stderr", entry)
        per.append(entry)
        if rc is None:
            failed = f"{kind}: command timed out after {timeout:g}s: {preview}"
            break
        if rc != 0:
            failed = f"{kind}: command exited with code {rc}: {preview}"
            break
    result: dict[str, Any] = {
        "returncode": -1 if rc is None else rc,
        "commands": per,
        "duration_ms": int((time.monotonic() - start) * 1000),
        "cwd": str(cwd),
    }
    _capture(b"".join(all_out), cap, ctx, "stdout", result)
    _capture(b"".join(all_err), cap, ctx, "stderr", result)
    if len(programs) == 1:
        per[0].update({k: result[k] for k in ("stdout", "stderr")})
    if failed is not None:
        tail = result["stderr"].strip().splitlines()[-1:] if result["stderr"].strip() else []
        message = failed + (f" ({tail[0][:200]})" if tail else "")
        if rc is None:
            raise ToolError(message, kind="timeout", retryable=True, code="timeout", result=result)
        raise ToolError(
            message, kind="exit_code", code=rc, details={"shell": {"returncode": rc}}, result=result
        )
    return result


def _preview(program: str) -> str:
    lines = program.strip().splitlines()
    return lines[0][:120] if lines else ""


def _cmds(inputs: Mapping[str, Any]) -> list[str]:
    raw = inputs.get("cmds")
    if isinstance(raw, str):
        raw = [raw]
    if raw is None:
        one = inputs.get("cmd") or inputs.get("command")
        raw = [one] if one else []
    cmds = [str(c) for c in raw if str(c).strip()]
    if not cmds:
        raise ToolError("shell: give the commands as cmds: [..] (or cmd: / command:)", kind="config_error")
    return cmds


@register_tool(
    "shell", config=ShellConfig, description="Shell commands in the execution's work directory (sandboxed)"
)
def shell_tool(inputs: dict[str, Any], ctx: ToolContext) -> Any:
    """Shell commands in the execution's work directory; stdout/stderr/returncode."""
    cmds = _cmds(inputs)
    return run_commands(
        [[SHELL_BIN, "-c", c] for c in cmds], [_preview(c) for c in cmds], inputs, ctx, "shell"
    )


def _script_source(inputs: Mapping[str, Any], ctx: ToolContext) -> tuple[str, str]:
    """(code, a file name for it)."""
    if inputs.get("code"):
        return str(inputs["code"]), "script"
    script = inputs.get("script")
    if isinstance(script, Mapping):
        src = script.get("source")
        if isinstance(src, Mapping) and src.get("code"):
            return str(src["code"]), str(script.get("name") or "script")
        if isinstance(src, str) and "\n" in src:
            return src, "script"
        script = (
            script.get("path") or script.get("uri") or (src.get("path") if isinstance(src, Mapping) else None)
        )
    if not script:
        raise ToolError(
            "script: give the script as script: <path> | {path|uri|source: {code}} or code:",
            kind="config_error",
        )
    ref = str(script)
    if ref.startswith("file://"):
        ref = ref[len("file://") :]
    if "://" in ref:
        raise ToolError(
            f"script: only local files are read ({ref!r}); fetch remote scripts with kind: http or gcs",
            kind="config_error",
        )
    path = Path(ref).expanduser()
    if not path.is_absolute():
        path = Path(ctx.base_dir or ".") / path
    from noetl_dagster.dsl.files import InputFileError, read_bounded_text  # noqa: PLC0415
    from noetl_dagster.dsl.source import YamlLimits  # noqa: PLC0415

    try:  # the bounded reader: a regular file within the playbook size limit (a FIFO would hang the run)
        return read_bounded_text(path, YamlLimits.from_env().max_bytes, what="script"), path.name
    except InputFileError as e:
        raise ToolError(f"script: cannot read {e}", kind="config_error") from None


def _write_script(folder: Path, name: str, code: str) -> Path:
    """The script file, written by the worker into a folder that sandboxed code of the same execution
    may have changed (the scratch folder is its own): one plain name (no path in a given ``name``),
    and no symlink followed, for the folder or the file."""
    safe = (
        "".join(c if c.isascii() and (c.isalnum() or c in "._-") else "_" for c in name).lstrip(".")
        or "script"
    )
    folder.mkdir(parents=True, exist_ok=True)
    try:
        dfd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        try:
            fd = os.open(safe, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644, dir_fd=dfd)
        finally:
            os.close(dfd)
    except OSError as e:
        raise ToolError(f"script: cannot write the script file in {folder}: {e.strerror} (a symlink?)",
                        kind="exec_error") from None  # fmt: skip
    with os.fdopen(fd, "w") as fh:
        fh.write(code)
    return folder / safe


@register_tool(
    "script",
    config=ScriptConfig,
    description="A script file or inline code run by an interpreter (sandboxed)",
)
def script_tool(inputs: dict[str, Any], ctx: ToolContext) -> Any:
    """A script (file or inline) run through an interpreter in the execution's work directory."""
    code, name = _script_source(inputs, ctx)
    interp = inputs.get("interpreter")
    if interp is None:
        interp = [sys.executable] if name.endswith(".py") else [SHELL_BIN]
    elif isinstance(interp, str):
        interp = [sys.executable] if interp in ("python", "python3") else interp.split()
    path = _write_script(work_dir(ctx, "script") / ".scripts", f"{ctx.step}-{ctx.task}-{name}", code)
    argv = [*map(str, interp), str(path), *(str(a) for a in inputs.get("args") or [])]
    return run_commands([argv], [f"{' '.join(map(str, interp))} {name}"], inputs, ctx, "script")
