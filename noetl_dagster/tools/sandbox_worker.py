"""The sandboxed worker of an execution (issue 41): in-process tool kinds run in the OS sandbox.

A path bug in a tool (a spelling the trust gate lets through) must not reach outside the
execution's folder. So when an execution is sandboxed (a generated playbook, or a playbook whose
isolation is ``sandbox``), the tool kinds that otherwise run inside the engine's own process
(:data:`SANDBOXED_KINDS`: duckdb, python, rhai) run in one child process per execution, started in
the sandbox of ``tools/sandbox.py`` (its scratch folder read-write, the runtime read-only, no
network) at the execution's first such task and kept for its later ones (DuckDB's in-memory
database lives on between steps, as in-process); closed with the execution's resources, and
killed with its parent (``--die-with-parent``, and ``PR_SET_PDEATHSIG`` in the child).

The protocol is length-prefixed JSON on the child's stdin/stdout (never pickle: what comes back is
data from the sandbox). The parent sends ``(kind, rendered config, the task's plain view of the
scope, execution facts)``; the child answers ``(result | error, logs, notes)``. The child never
sees the payload store, the event store or the keychain: a result a tool spills by reference (a
large DuckDB result as Arrow IPC) is written into the scratch folder and the parent moves it into
the execution's payload store itself (its own key, its own checksum) before the engine records it.
"""

from __future__ import annotations

import os
import stat
import struct
import sys
import threading
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from noetl_dagster.tools.registry import ToolError
from noetl_dagster.tools.remote_call import RemoteContext, call_as_reply, reply_outcome

SANDBOXED_KINDS = frozenset({"duckdb", "python", "rhai"})
SPILL_STORE = "sandbox"  # the child's stand-in payload store (a folder in the scratch)
SPILL_DIR = ".spill"
DEFAULT_TIMEOUT_S = 300.0  # a python task's own spec.timeout wins
START_TIMEOUT_S = 120.0  # the worker's own start (an interpreter and this package's imports)
MAX_MESSAGE = 1 << 30
_HEADER = struct.Struct(">I")
DETAIL_KEYS = frozenset({"py", "duckdb"})  # an error outcome's kind helpers these kinds give

STARTS: Counter[str] = Counter()  # worker starts by execution id (tests and the benchmark read it)


# -- the parent's side -----------------------------------------------------------------------------
class SandboxPort:
    """``Services.sandbox`` (engine.ports.SandboxPort): which kinds run sandboxed and how a worker starts."""

    kinds = SANDBOXED_KINDS

    def start(self, ctx: Any) -> SandboxWorker | None:
        """The execution's worker (None under the operator's ``env-only`` opt-out: in-process)."""
        from noetl_dagster.tools import sandbox  # noqa: PLC0415 - the launcher: sandboxed executions only

        scratch = sandbox.task_scratch(ctx, f"task {getattr(ctx, 'task', '?')!r} (sandbox worker)")
        if scratch is None:
            return None
        return SandboxWorker(scratch, str(ctx.execution_id), str(getattr(ctx, "tenant", None) or "default"),
                             hosts=getattr(ctx, "allow_hosts", None))  # fmt: skip


class SandboxWorker:
    """One execution's child process in the sandbox; :meth:`call` runs one task in it (one at a time)."""

    def __init__(self, scratch: str, execution_id: str, tenant: str, hosts: frozenset[str] | None = None):
        self.scratch = scratch
        self.execution_id = execution_id
        self.tenant = tenant
        self.hosts = hosts  # the grant's allow_hosts: reached through an egress proxy (none: no network)
        self._proxy: Any = None
        self._refused: list[str] = []
        self._lock = threading.Lock()
        self._proc: Any = None
        self._stderr: Any = None
        self._charged = 0.0  # the worker's CPU charged to its tasks (not again when it is reaped)

    # the process -------------------------------------------------------------------------------
    def _argv(self) -> Any:
        from noetl_dagster.tools import sandbox  # noqa: PLC0415

        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.realpath(__file__))))
        code = f"import sys; sys.path.insert(0, {root!r}); from noetl_dagster.tools.sandbox_worker import child_main; child_main()"
        if self.hosts and self._proxy is None:  # one proxy for the worker's life, closed with it
            from noetl_dagster.tools.egress import EgressProxy  # noqa: PLC0415

            uid = sandbox.outside_uid(self.execution_id, self.tenant)
            self._proxy = EgressProxy(self.hosts, uid=uid, on_refuse=self._refused.append).__enter__()
        return sandbox.confine([sys.executable, "-I", "-c", code, self.scratch], scratch=self.scratch,
                               execution_id=self.execution_id, tenant=self.tenant, limits=sandbox.Limits.from_env(),
                               proxy_socket=self._proxy.socket_path if self._proxy is not None else None)  # fmt: skip

    def _start(self) -> None:
        import subprocess  # noqa: PLC0415 - sandboxed executions only (issue 35: a run imports none)
        import tempfile  # noqa: PLC0415

        box = self._argv()
        self._stderr = tempfile.TemporaryFile()  # outside the scratch: the child cannot rewrite it
        self._proc = proc = subprocess.Popen(box.argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                             stderr=self._stderr, env=box.env, cwd=box.cwd)  # fmt: skip
        STARTS[self.execution_id] += 1
        # the start is not the task's: a task's timeout runs from the worker's ready line
        timer = threading.Timer(START_TIMEOUT_S, proc.kill)
        timer.start()
        try:
            ready = _receive(proc.stdout)
        except (OSError, ValueError):
            ready = None
        finally:
            timer.cancel()
        if not (isinstance(ready, dict) and ready.get("op") == "ready"):
            raise self._died("did not start")

    def _alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def close(self) -> None:
        from noetl_dagster.engine.usage import count  # noqa: PLC0415

        proc, self._proc = self._proc, None
        if proc is None:
            return
        try:
            if proc.poll() is None:
                _send(proc.stdin, {"op": "stop"})
                proc.stdin.close()
                proc.wait(timeout=5)
        except Exception:  # noqa: BLE001 - a stuck or dead child is killed
            proc.kill()
            proc.wait()
        finally:
            count(child_cpu_charged_s=self._charged)  # an attempt reaping it: its tasks had this part
            self._charged = 0.0
            if self._proxy is not None:
                self._proxy.__exit__(None, None, None)
                self._proxy = None
            for f in (proc.stdout, self._stderr):
                try:
                    if f is not None:
                        f.close()
                except OSError:
                    pass

    def _died(self, what: str) -> ToolError:
        err = ""
        if self._stderr is not None:
            try:
                self._stderr.seek(0)
                err = self._stderr.read()[-2000:].decode(errors="replace").strip()
            except (OSError, ValueError):
                pass
        self.close()
        last = err.splitlines()[-1] if err else "no message"
        return ToolError(f"sandbox worker {what}: {last}", kind="sandbox_worker",
                         details={"py": {"exception_type": "SandboxWorker", "stderr": err}})  # fmt: skip

    # one task ----------------------------------------------------------------------------------
    def call(self, kind: str, config: Mapping[str, Any], ctx: Any) -> Any:
        """Run ``kind`` with ``config`` in the worker (started on first use); the result or a ToolError."""
        spec = dict(getattr(ctx, "spec", None) or {})
        timeout = float(spec.get("timeout") or spec.get("timeout_seconds") or DEFAULT_TIMEOUT_S)
        scope = getattr(ctx, "render_context", None)
        offloader = getattr(ctx, "offloader", None)
        request = {
            "op": "call", "kind": kind, "config": dict(config),
            "ctx": {"execution_id": str(ctx.execution_id), "step": ctx.step, "task": ctx.task,
                    "attempt": ctx.attempt, "spec": {k: v for k, v in spec.items() if k != "isolation"},
                    "tenant": getattr(ctx, "tenant", None), "project": getattr(ctx, "project", None),
                    "context": scope.plain() if hasattr(scope, "plain") else {},
                    "inline_limit": getattr(ctx, "inline_limit", None) or getattr(offloader, "inline_limit", None),
                    "key_prefix": getattr(offloader, "key_prefix", "") or ""},
        }  # fmt: skip
        with self._lock:
            if not self._alive():
                self._start()
            proc, fired = self._proc, threading.Event()
            before = _tree_cpu(proc.pid)

            def kill() -> None:
                fired.set()
                proc.kill()

            timer = threading.Timer(timeout, kill)
            timer.start()
            try:
                _send(proc.stdin, request)
                reply = _receive(proc.stdout)
            except (OSError, ValueError):
                reply = None
            finally:
                timer.cancel()
            if reply is None:
                raise self._timeout(timeout) if fired.is_set() else self._died("ended")
            self._charged += _charge(proc.pid, before, reply)
            refused, self._refused[:] = list(self._refused), []
        if refused and callable(getattr(ctx, "note", None)):  # as a per-task sandboxed process notes them
            ctx.note(egress_refused=refused[:20])
        # the worker runs the tenant's code: its reply is data, each field checked before it is used
        return reply_outcome(reply, ctx, detail_keys=DETAIL_KEYS, adopt=lambda value: self._adopt(value, ctx),
                             default_message="sandboxed task failed")  # fmt: skip

    def _timeout(self, timeout: float) -> ToolError:
        self.close()
        return ToolError(f"sandboxed task timed out after {timeout:g}s (the worker was stopped)", kind="timeout",
                         retryable=True, details={"py": {"exception_type": "TimeoutExpired"}})  # fmt: skip

    # spilled results ---------------------------------------------------------------------------
    def _adopt(self, value: Any, ctx: Any) -> Any:
        """``value`` with every reference into the scratch's spill folder moved into the execution's
        payload store (the parent's key and checksum; the child's file is removed)."""
        seen = [0]

        def walk(v: Any) -> Any:
            if isinstance(v, dict):
                ref = v.get("$ref") if len(v) == 1 else None
                if isinstance(ref, dict) and ref.get("store") == SPILL_STORE:
                    seen[0] += 1
                    return self._move(ref, ctx, seen[0])
                return {k: walk(x) for k, x in v.items()}
            if isinstance(v, list):
                return [walk(x) for x in v]
            return v

        return walk(value)

    def _move(self, ref: Mapping[str, Any], ctx: Any, n: int) -> dict[str, Any]:
        from noetl_dagster.storage.locator import sign_for  # noqa: PLC0415
        from noetl_dagster.storage.payload import ResultRef, sha256  # noqa: PLC0415

        name = str(ref.get("uri") or "").removeprefix(f"{SPILL_STORE}:")
        if not (
            len(name) == 68 and name.endswith(".bin") and all(c in "0123456789abcdef" for c in name[:64])
        ):
            raise ToolError(f"sandbox worker: a spilled result names {name[:80]!r}", kind="sandbox_worker")
        fmt = str(ref.get("format") or "bin")
        if not (fmt.isascii() and fmt.replace("_", "").isalnum() and len(fmt) <= 16):
            raise ToolError(f"sandbox worker: a spilled result's format {fmt[:40]!r}", kind="sandbox_worker")
        store = ctx.payloads
        key = f"{getattr(getattr(ctx, 'offloader', None), 'key_prefix', '') or ''}{ctx.execution_id}/{ctx.step}/{ctx.task}-attempt{ctx.attempt}"
        key += f".{fmt}" if n == 1 else f"-{n}.{fmt}"
        # the folder and the file opened without following links, the file only if regular (not a FIFO
        # that would block): the child owns the scratch and may have planted either
        flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK
        try:
            dir_fd = os.open(os.path.join(self.scratch, SPILL_DIR), flags | os.O_DIRECTORY)
        except OSError as e:
            raise ToolError(
                f"sandbox worker: no spilled result to move: {e.strerror}", kind="sandbox_worker"
            ) from None
        try:
            fd = os.open(name, flags, dir_fd=dir_fd)
        except OSError as e:
            os.close(dir_fd)
            raise ToolError(
                f"sandbox worker: a spilled result cannot be read: {e.strerror}", kind="sandbox_worker"
            ) from None
        try:
            with os.fdopen(fd, "rb") as src:
                if not stat.S_ISREG(os.fstat(src.fileno()).st_mode):
                    raise ToolError("sandbox worker: a spilled result is not a file", kind="sandbox_worker")
                try:
                    writer = store.writer(key)
                except NotImplementedError:
                    writer = None
                if writer is None:
                    data = src.read()
                    uri, size, checksum = store.put_bytes(key, data), len(data), sha256(data)
                else:
                    with writer:
                        while chunk := src.read(1 << 20):
                            writer.write(chunk)
                    uri, size, checksum = writer.uri, writer.size, writer.checksum
        finally:
            try:
                os.unlink(name, dir_fd=dir_fd)
            except OSError:
                pass
            os.close(dir_fd)
        rows = ref.get("rows")
        out = ResultRef(uri=uri, store=store.name, format=fmt, size=size, checksum=checksum,
                        rows=rows if isinstance(rows, int) else None,
                        schema_fingerprint=ref.get("schema_fingerprint") if isinstance(ref.get("schema_fingerprint"), str) else None)  # fmt: skip
        return sign_for(
            ctx, out, store
        ).envelope()  # readable by this tenant's later steps (storage/locator.py)


def _send(pipe: Any, message: Any) -> None:
    from noetl_dagster.util.jsonutil import dumps  # noqa: PLC0415

    body = dumps(message).encode("utf-8", "replace")
    pipe.write(_HEADER.pack(len(body)) + body)
    pipe.flush()


def _receive(pipe: Any) -> Any:
    import json  # noqa: PLC0415

    head = pipe.read(_HEADER.size)
    if len(head) < _HEADER.size:
        return None
    (size,) = _HEADER.unpack(head)
    if size > MAX_MESSAGE:
        raise ValueError(f"message of {size} bytes")
    body = pipe.read(size)
    if len(body) < size:
        return None
    return json.loads(body)


def _tree_cpu(pid: int) -> float:
    """CPU seconds of ``pid`` and its live descendants, as the kernel counts them (the launcher and
    the worker inside its PID namespace): the parent charges a task what the worker spent on it."""
    tick = os.sysconf("SC_CLK_TCK")
    total, todo, seen = 0, [pid], set()
    while todo:
        p = todo.pop()
        if p in seen:
            continue
        seen.add(p)
        try:
            with open(f"/proc/{p}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
            total += sum(int(x) for x in fields[11:15])  # utime stime cutime cstime
            for tid in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{tid}/children", "rb") as f:
                    todo.extend(int(x) for x in f.read().split())
        except (OSError, ValueError, IndexError):
            continue
    return total / tick


def _charge(pid: int, before: float, reply: Mapping[str, Any]) -> float:
    """Charge the running task the worker's CPU since ``before`` (and its peak RSS); returns it."""
    from noetl_dagster.engine.usage import count, peak  # noqa: PLC0415

    spent = max(_tree_cpu(pid) - before, 0.0)
    count(live_child_cpu_s=spent)
    hwm = reply.get("hwm")
    if isinstance(hwm, int) and hwm > 0:  # the worker's own VmHWM (a figure it reports)
        peak(child_maxrss_bytes=hwm)
    return spent


# -- the child's side (inside the sandbox) ---------------------------------------------------------
def child_main() -> None:
    """The worker's loop: one request at a time until ``stop`` or the parent's end (EOF)."""
    try:  # die with the parent even when a launcher sits between (PR_SET_PDEATHSIG = 1)
        import ctypes  # noqa: PLC0415
        import signal  # noqa: PLC0415

        ctypes.CDLL(None).prctl(1, int(signal.SIGKILL), 0, 0, 0)
    except (OSError, AttributeError):
        pass
    scratch = os.path.realpath(sys.argv[1])
    # the protocol gets its own descriptors; a tool's print or a C library's write goes to stderr
    proto_in = os.fdopen(os.dup(0), "rb")
    proto_out = os.fdopen(os.dup(1), "wb")
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.dup2(2, 1)
    os.chdir(scratch)
    resources: dict[str, Any] = {}
    import noetl_dagster.dsl.kinds  # noqa: F401, PLC0415 - before the ready line: the kinds' catalogue

    _send(proto_out, {"op": "ready"})
    try:
        while True:
            req = _receive(proto_in)
            if req is None or req.get("op") != "call":
                break
            _send(proto_out, _handle(req, scratch, resources))
    finally:
        for r in resources.values():
            close = getattr(r, "close", None)
            if callable(close):
                try:
                    close()
                except Exception:  # noqa: BLE001, S110 - ending anyway
                    pass


def _handle(req: Mapping[str, Any], scratch: str, resources: dict[str, Any]) -> dict[str, Any]:
    from noetl_dagster.dsl.kinds import get_tool  # noqa: PLC0415
    from noetl_dagster.engine.usage import own_hwm  # noqa: PLC0415

    ctx = _ChildCtx(req.get("ctx") or {}, scratch, resources)
    kind = str(req.get("kind"))
    tool = get_tool(kind) if kind in SANDBOXED_KINDS else None
    out = call_as_reply(
        tool, req.get("config") or {}, ctx, f"tool kind {kind!r} does not run in the sandbox worker"
    )
    out.update(hwm=own_hwm())
    return out


class _SpillStore:
    """The child's payload store: files in the scratch's spill folder, moved out by the parent."""

    name = SPILL_STORE

    def __init__(self, scratch: str):
        self.root = Path(scratch) / SPILL_DIR

    def writer(self, key: str, algorithm: str | None = None) -> Any:
        raise NotImplementedError  # the tool builds the file in memory, then put_bytes

    def put_bytes(self, key: str, data: bytes) -> str:
        import hashlib  # noqa: PLC0415

        self.root.mkdir(exist_ok=True)
        name = hashlib.sha256(key.encode()).hexdigest() + ".bin"
        (self.root / name).write_bytes(data)
        return f"{SPILL_STORE}:{name}"

    def get_bytes(self, uri: str) -> bytes:
        return (self.root / uri.removeprefix(f"{SPILL_STORE}:")).read_bytes()


class _Offloader:
    def __init__(self, key_prefix: str, inline_limit: Any):
        self.key_prefix = key_prefix
        self.inline_limit = inline_limit


class _ChildCtx(RemoteContext):
    """What a tool sees inside the worker: the task's facts and plain scope; no keychain, no stores."""

    def __init__(self, meta: Mapping[str, Any], scratch: str, resources: dict[str, Any]):
        self.execution_id = str(meta.get("execution_id"))
        self.step = meta.get("step")
        self.task = meta.get("task")
        self.attempt = meta.get("attempt") or 1
        self.spec = meta.get("spec") or {}
        self.tenant = meta.get("tenant") or "default"
        self.project = meta.get("project") or "default"
        self.render_context = meta.get("context") or {}
        self.base_dir = None
        self.scope_dir = self.data_dir = scratch  # DuckDB's own confinement applies inside too
        self.restricted = False  # the sandbox is the isolation: no process per python task in here
        self.isolation = None
        self.inline_limit = meta.get("inline_limit")
        self.offloader = _Offloader(str(meta.get("key_prefix") or ""), self.inline_limit)
        self.payloads = _SpillStore(scratch)
        super().__init__(resources)  # the worker's resources: DuckDB's database lives on between calls

    def credential(self, name: str) -> dict[str, Any]:
        raise ToolError(f"credential {name!r}: credentials are not available inside the sandbox",
                        kind="credential_not_delegated")  # fmt: skip

    def run_playbook(self, path: str, workload: Any, **kw: Any) -> dict[str, Any]:
        raise ToolError("a sandboxed task cannot start a playbook", kind="sandbox_refused")
