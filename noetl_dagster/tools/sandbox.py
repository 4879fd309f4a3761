"""The OS sandbox for untrusted code: bubblewrap (``bwrap``), not a home-made jail.

Code of a generated playbook (and of any playbook whose tenant/project policy or own
``executor.spec.isolation`` says ``sandbox``) runs confined by the kernel:

* **its own unprivileged uid**. A root worker confines to a per-execution uid/gid,
  ``SANDBOX_UID_BASE + sha256(tenant/execution id) % SANDBOX_UID_COUNT`` (200000-265535): bwrap,
  started as root so it can bind a runtime the uid cannot traverse (a python under ``/root``),
  builds the namespaces; inside, ``setpriv`` drops to that uid with no supplementary groups, an
  empty capability bounding set and ``no_new_privs`` before anything of the task runs. A
  non-root worker cannot change uid: bwrap's unprivileged user namespace is the confinement
  (``--cap-drop ALL``) and the uid outside is the worker's own (the mount namespace below is
  what hides its files).
* **a filesystem of its own**: the scratch folder read-write (the same path inside as outside),
  the runtime read-only (``/usr`` and its ``/bin``, ``/lib*`` links, the python prefix, the
  venv, this package's source), a few ``/etc`` files programs need (TLS certificates, ld.so
  cache, time zones) and a synthetic ``/etc/passwd``, ``/etc/group``, ``/etc/hosts``; a fresh
  ``/proc``, a minimal ``/dev`` and a bounded tmpfs ``/tmp``. Nothing else of the host: not its
  ``/etc/passwd``, ``/root``, ``/work``, the data dir with its event store, payloads, keychain
  and other executions' folders.
* **no network**: its own network namespace (loopback only). With ``proxy_socket`` (a unix
  socket of the parent's :class:`noetl_dagster.tools.egress.EgressProxy`, which refuses hosts
  outside the grant's ``allow_hosts`` and resolves names itself), a forwarder inside listens
  on ``127.0.0.1:PROXY_PORT`` and ``HTTP(S)_PROXY`` point at it.
* **nothing inherited**: ``--clearenv`` (PATH, LANG, HOME/TMPDIR/NOETL_DAGSTER_HOME = scratch,
  PYTHONPATH to this package, proxy variables, plus what the caller passes), ``--new-session``
  (no terminal injection), ``--die-with-parent``, no capabilities; file descriptors other than
  0-2 are the caller's to close (``subprocess`` does by default).
* **a syscall filter** (seccomp, compiled with libseccomp, bwrap ``--seccomp``): no ptrace, no
  keyring, no new namespaces (no nested user namespace), no mounts, modules, eBPF or perf events
  (``_DENIED_SYSCALLS``).
* **limits** (``prlimit``): CPU seconds, address space, file size, processes (per uid: the
  per-execution uid makes it per execution), open files; a bounded ``/tmp``.

Use::

    from noetl_dagster.tools import sandbox
    sandbox.require("python")            # ToolError(kind=sandbox_unavailable) where it cannot be built
    scratch = sandbox.scratch_dir(execution_dir, execution_id, tenant)   # created, owned by the uid
    with EgressProxy(allow_hosts, uid=...) as proxy:                      # tools/egress.py (optional)
        box = sandbox.confine([sys.executable, "-c", code], scratch=scratch, execution_id=execution_id,
                              tenant=tenant, proxy_socket=proxy.socket_path, limits=sandbox.Limits.from_env())
        subprocess.Popen(box.argv, env=box.env, cwd=box.cwd, ...)        # close_fds stays True

A tool with a ToolContext uses :func:`task_scratch` (None: not sandboxed), :func:`task_egress`
and :func:`task_command` instead (core.py's python, shell.py, mcp.py).

``box.argv`` is self-contained (``/bin/sh`` hands the synthetic ``/etc`` files to bwrap as
here-documents, then execs it): it can be given to any process launcher, including one that
takes only command/args/env. ``box.preexec_fn`` is always ``None`` (limits are set by
``prlimit``, so nothing runs between fork and exec in a threaded worker). Exit code and output
are the command's.

Where bwrap or unprivileged user namespaces are missing, :func:`require` refuses the task
(``sandbox_unavailable``) instead of running the code unconfined, unless the operator set
``NOETL_GENERATED_ISOLATION=env-only`` (then the code runs with a scrubbed environment only).
"""

from __future__ import annotations

import hashlib
import os
import sys
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path

from noetl_dagster.tools.registry import ToolError

ISOLATION_ENV = "NOETL_GENERATED_ISOLATION"  # "env-only": the operator's explicit opt-out
UNAVAILABLE = "sandbox_unavailable"
SANDBOX_UID_BASE = 200000
SANDBOX_UID_COUNT = 65536
PROXY_PORT = 3128  # inside the sandbox's own network namespace: no clash with the host
PROXY_DIR = "/run/noetl-proxy"  # where the proxy socket's folder shows inside
_FIRST_FD = 3  # the here-documents of /etc files (dash redirects single-digit descriptors only)


@dataclass(frozen=True)
class Limits:
    """rlimits of a sandboxed process (and its children: processes count per uid)."""

    cpu_seconds: int = 600
    memory_bytes: int = 4 << 30  # address space (virtual memory)
    file_bytes: int = 1 << 30  # largest file it may write
    processes: int = 256
    open_files: int = 1024
    tmp_bytes: int = 256 << 20  # the tmpfs /tmp

    @classmethod
    def from_env(cls) -> Limits:
        """The defaults, or the operator's ``NOETL_SANDBOX_{CPU_SECONDS,MEMORY_MB,FILE_MB,PROCESSES}``."""
        out = cls()
        for key, attr, scale in (("CPU_SECONDS", "cpu_seconds", 1), ("MEMORY_MB", "memory_bytes", 1 << 20),
                                 ("FILE_MB", "file_bytes", 1 << 20), ("PROCESSES", "processes", 1)):  # fmt: skip
            raw = os.environ.get(f"NOETL_SANDBOX_{key}", "").strip()
            if raw:
                if not (raw.isascii() and raw.isdigit()) or int(raw) < 1:
                    raise ToolError(f"NOETL_SANDBOX_{key} must be a positive integer, got {raw!r}",
                                    kind="config_error")  # fmt: skip
                out = replace(out, **{attr: int(raw) * scale})
        return out


@dataclass(frozen=True)
class Confined:
    """A confined command: give ``argv``, ``env`` and ``cwd`` to the process launcher."""

    argv: list[str]
    env: dict[str, str]
    cwd: str
    uid: int  # the uid outside (the worker's own when it is not root)
    preexec_fn: None = None
    binds: tuple[str, ...] = field(default=())  # host paths shown inside (read-only but the scratch)


def env_only() -> bool:
    return os.environ.get(ISOLATION_ENV, "").strip().lower() == "env-only"


def sandbox_uid(execution_id: str, tenant: str = "default") -> int:
    """The execution's uid (and gid) when the worker is root; stable for an execution."""
    digest = hashlib.sha256(f"{tenant}/{execution_id}".encode()).digest()
    return SANDBOX_UID_BASE + int.from_bytes(digest[:8], "big") % SANDBOX_UID_COUNT


def outside_uid(execution_id: str, tenant: str) -> int:
    """The uid the sandboxed code has outside: the execution's as root, else the worker's own."""
    return sandbox_uid(execution_id, tenant) if os.geteuid() == 0 else os.geteuid()


def scratch_dir(parent: str | os.PathLike[str], execution_id: str, tenant: str = "default") -> str:
    """``<parent>/sandbox``, created and owned by the execution's sandbox uid (read-write inside)."""
    path = Path(parent) / "sandbox"
    path.mkdir(parents=True, exist_ok=True)
    uid = outside_uid(execution_id, tenant)
    if os.geteuid() == 0:
        os.chown(path, uid, uid)
    os.chmod(path, 0o700)
    return str(path.resolve())


def _tool(name: str) -> str | None:
    import shutil  # noqa: PLC0415 - the probe only

    return shutil.which(name, path="/usr/bin:/bin:/usr/sbin:/sbin:/usr/local/bin")


def _runtime_dirs() -> list[str]:
    """The python prefix, the venv and this package's source: read-only inside, at the same paths."""
    found = [os.path.realpath(p) for p in (sys.base_prefix, sys.prefix)]
    found.append(str(Path(__file__).resolve().parents[1]))  # the noetl_dagster package
    out: list[str] = []
    for p in sorted(set(found), key=len):
        if p.startswith("/usr/") or p == "/usr" or any(p.startswith(o + "/") for o in out):
            continue
        if os.path.isdir(p):
            out.append(p)
    return out


# denied inside (EPERM): other processes' memory, the kernel keyring, new namespaces (a nested user
# namespace would hand the code capabilities over a fresh mount namespace: kernel attack surface),
# mounts, modules, eBPF, perf, userfaultfd, file handles; clone3 answers ENOSYS (its flags sit behind
# a pointer seccomp cannot read), so libc falls back to clone, whose CLONE_NEWUSER is denied
_DENIED_SYSCALLS = ("ptrace", "process_vm_readv", "process_vm_writev", "keyctl", "add_key", "request_key",
                    "unshare", "setns", "mount", "umount2", "pivot_root", "fsopen", "fsmount", "move_mount",
                    "open_tree", "bpf", "perf_event_open", "userfaultfd", "kexec_load", "kexec_file_load",
                    "init_module", "finit_module", "delete_module", "open_by_handle_at", "name_to_handle_at",
                    "acct", "swapon", "swapoff", "reboot", "quotactl")  # fmt: skip
_CLONE_NEWUSER = 0x10000000
_seccomp_path: str | None = None


def seccomp_filter() -> str:
    """A file holding the sandbox's seccomp BPF program (bwrap ``--seccomp``), compiled once per
    process with libseccomp (Debian ``libseccomp2``); OSError where the library is missing."""
    global _seccomp_path
    if _seccomp_path is not None and os.path.exists(_seccomp_path):
        return _seccomp_path
    import ctypes  # noqa: PLC0415 - the first sandboxed call only
    import ctypes.util  # noqa: PLC0415
    import tempfile  # noqa: PLC0415

    class _Arg(ctypes.Structure):  # struct scmp_arg_cmp
        _fields_ = [
            ("arg", ctypes.c_uint),
            ("op", ctypes.c_int),
            ("a", ctypes.c_uint64),
            ("b", ctypes.c_uint64),
        ]

    lib = ctypes.CDLL(ctypes.util.find_library("seccomp") or "libseccomp.so.2")
    lib.seccomp_init.restype = ctypes.c_void_p
    lib.seccomp_init.argtypes = [ctypes.c_uint32]
    lib.seccomp_syscall_resolve_name.argtypes = [ctypes.c_char_p]
    lib.seccomp_rule_add_array.argtypes = [ctypes.c_void_p, ctypes.c_uint32, ctypes.c_int, ctypes.c_uint,
                                           ctypes.POINTER(_Arg)]  # fmt: skip
    lib.seccomp_export_bpf.argtypes = [ctypes.c_void_p, ctypes.c_int]
    lib.seccomp_release.argtypes = [ctypes.c_void_p]
    allow, eperm, enosys = 0x7FFF0000, 0x00050000 | 1, 0x00050000 | 38  # SCMP_ACT_ALLOW, SCMP_ACT_ERRNO(..)
    ctx = lib.seccomp_init(allow)
    if not ctx:
        raise OSError("seccomp_init failed")
    try:
        rules = [(eperm, name, None) for name in _DENIED_SYSCALLS]
        rules += [
            (enosys, "clone3", None),
            (eperm, "clone", (_Arg * 1)(_Arg(0, 7, _CLONE_NEWUSER, _CLONE_NEWUSER))),
        ]
        for action, name, args in rules:  # op 7: SCMP_CMP_MASKED_EQ on the flags argument
            nr = lib.seccomp_syscall_resolve_name(name.encode())
            if nr < 0:  # a name this libseccomp does not know: nothing to deny on this kernel
                continue
            if lib.seccomp_rule_add_array(ctx, action, nr, 1 if args else 0, args) != 0:
                raise OSError(f"seccomp: cannot add a rule for {name}")
        fd, path = tempfile.mkstemp(prefix="noetl-seccomp-", suffix=".bpf")
        try:
            if lib.seccomp_export_bpf(ctx, fd) != 0:
                raise OSError("seccomp_export_bpf failed")
        finally:
            os.close(fd)
    finally:
        lib.seccomp_release(ctx)
    import atexit  # noqa: PLC0415

    atexit.register(_unlink, path)  # one small file per process, not left in /tmp
    _seccomp_path = path
    return path


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def _ancestors(path: str) -> list[str]:
    """The folders above ``path`` that the sandbox's own root does not already have."""
    parts = Path(path).parts[1:-1]
    out = ["/" + "/".join(parts[: i + 1]) for i in range(len(parts))]
    return [p for p in out if p not in ("/usr", "/tmp", "/proc", "/dev") and not p.startswith("/usr/")]


def _etc_text(uid: int) -> dict[str, str]:
    return {
        "/etc/passwd": f"sandbox:x:{uid}:{uid}:noetl sandbox:/nonexistent:/usr/sbin/nologin\n",
        "/etc/group": f"sandbox:x:{uid}:\n",
        "/etc/hosts": "127.0.0.1 localhost\n::1 localhost\n",
    }


# read-only /etc files programs need that hold nothing of the host's users or secrets
_ETC = ("/etc/ssl", "/etc/ca-certificates", "/etc/alternatives", "/etc/ld.so.cache", "/etc/localtime",
        "/etc/nsswitch.conf", "/etc/mime.types", "/etc/zoneinfo")  # fmt: skip

# inside: listen on 127.0.0.1:PROXY_PORT, relay each connection to the parent's egress proxy socket
_FORWARDER = r"""
import os, socket, sys, threading
sock, port = sys.argv[1], int(sys.argv[2])
srv = socket.socket(); srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
srv.bind(("127.0.0.1", port)); srv.listen(64)
def pump(a, b):
    try:
        while True:
            d = a.recv(65536)
            if not d: break
            b.sendall(d)
    except OSError: pass
    finally:
        try: b.shutdown(socket.SHUT_WR)
        except OSError: pass
def serve():
    while True:
        c, _ = srv.accept()
        u = socket.socket(socket.AF_UNIX)
        try: u.connect(sock)
        except OSError: c.close(); continue
        for a, b in ((c, u), (u, c)): threading.Thread(target=pump, args=(a, b), daemon=True).start()
if os.fork() == 0:
    try: serve()
    finally: os._exit(0)
srv.close()
os.execvp(sys.argv[4], sys.argv[4:])
"""


def confine(
    argv: list[str],
    *,
    scratch: str,
    execution_id: str,
    tenant: str = "default",
    proxy_socket: str | None = None,
    limits: Limits | None = None,
    env: Mapping[str, str] | None = None,
    ro_paths: Iterable[str] = (),
    cwd: str | None = None,
) -> Confined:
    """``argv`` confined by bwrap (see the module doc). ``scratch`` is the read-write folder (the
    working directory; make it with :func:`scratch_dir`); ``proxy_socket`` the egress proxy's unix
    socket (no network at all without it); ``env`` extra variables; ``ro_paths`` extra host paths
    shown read-only; ``cwd`` the working directory inside (default: ``scratch``). Builds the command line only: call :func:`require` first to fail closed."""
    lim = limits or Limits()
    scratch = os.path.realpath(scratch)
    root = os.geteuid() == 0
    uid = outside_uid(execution_id, tenant)
    inside = uid if root else sandbox_uid(execution_id, tenant)
    data: list[tuple[int, str]] = []  # (fd, text) given to bwrap as here-documents

    if root:  # bwrap (as root: it can read a runtime under /root) builds the namespaces; setpriv drops
        args = ["bwrap", "--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts",
                "--unshare-cgroup-try"]  # fmt: skip
        drop = ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--inh-caps=-all",
                "--bounding-set=-all", "--no-new-privs", "--"]  # fmt: skip
    else:  # an unprivileged user namespace is the confinement; the uid outside stays the worker's
        args = ["bwrap", "--unshare-all", "--uid", str(inside), "--gid", str(inside), "--cap-drop", "ALL"]
        drop = []
    args += ["--hostname", "sandbox", "--die-with-parent", "--new-session", "--clearenv", "--seccomp", "9"]
    for top in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
        if os.path.islink(top):
            args += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            args += ["--ro-bind", top, top]
    # first the fresh mounts: a scratch folder under /tmp (tests) is bound on top of the tmpfs
    args += ["--proc", "/proc", "--dev", "/dev", "--size", str(lim.tmp_bytes), "--tmpfs", "/tmp"]
    args += ["--ro-bind", "/usr", "/usr", "--perms", "0755", "--dir", "/etc"]
    for p in _ETC:
        args += ["--ro-bind-try", p, p]
    runtime = _runtime_dirs()
    binds = ["/usr", *runtime, *ro_paths, scratch]
    for p in sorted({a for b in [*runtime, *ro_paths, scratch] for a in _ancestors(b)}, key=len):
        args += ["--perms", "0755", "--dir", p]  # traversable by the uid (bwrap's own default is 0700)
    for p in [*runtime, *ro_paths]:
        args += ["--ro-bind", p, p]
    args += ["--bind", scratch, scratch]
    for fd, (path, text) in enumerate(_etc_text(inside).items(), start=_FIRST_FD):
        data.append((fd, text))
        args += ["--perms", "0644", "--ro-bind-data", str(fd), path]
    args += ["--chdir", cwd or scratch]

    pkg = [p for p in runtime if p.endswith("/noetl_dagster")]
    clean = {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "LANG": os.environ.get("LANG", "C.UTF-8"),
        "HOME": scratch,
        "TMPDIR": scratch,
        "NOETL_DAGSTER_HOME": scratch,  # this package's data dir, for code that uses it
        "PYTHONDONTWRITEBYTECODE": "1",
        **({"PYTHONPATH": os.path.dirname(pkg[0])} if pkg else {}),
        **{str(k): str(v) for k, v in (env or {}).items()},
    }
    cmd = list(argv)
    if proxy_socket:
        sock_dir = os.path.dirname(os.path.realpath(proxy_socket))
        args += [
            "--perms",
            "0755",
            "--dir",
            "/run",
            "--ro-bind",
            sock_dir,
            PROXY_DIR,
        ]  # the socket's own folder, owned by the uid
        binds.append(sock_dir)
        inner = f"{PROXY_DIR}/{os.path.basename(proxy_socket)}"
        url = f"http://127.0.0.1:{PROXY_PORT}"
        clean.update(HTTP_PROXY=url, HTTPS_PROXY=url, http_proxy=url, https_proxy=url, ALL_PROXY=url,
                     NO_PROXY="", no_proxy="")  # fmt: skip
        cmd = [sys.executable, "-I", "-S", "-c", _FORWARDER, inner, str(PROXY_PORT), "--", *cmd]
    for k, v in clean.items():
        args += ["--setenv", k, v]
    limit = ["prlimit", f"--cpu={lim.cpu_seconds}", f"--as={lim.memory_bytes}", f"--fsize={lim.file_bytes}",
             f"--nproc={lim.processes}", f"--nofile={lim.open_files}", "--"]  # fmt: skip
    args += ["--", *drop, *limit, *cmd]
    prologue = f"exec 9<{_quote(seccomp_filter())}\n"  # the seccomp program (fd 9, see _DENIED_SYSCALLS)
    prologue += "".join(f"exec {fd}<<'NOETL_EOF'\n{text}NOETL_EOF\n" for fd, text in data)
    full = ["/bin/sh", "-c", prologue + 'exec "$@"\n', "noetl-sandbox", *args]
    return Confined(argv=full, env={"PATH": "/usr/bin:/bin"}, cwd="/", uid=uid, binds=tuple(binds))


def _quote(path: str) -> str:
    return "'" + path.replace("'", "'\\''") + "'"


_probe: str | None = None  # "" = works, else why not


def unavailable_reason() -> str | None:
    """Why this host cannot build the sandbox (None when it can); probed once per process."""
    global _probe
    if _probe is None:
        missing = [
            t for t in ("bwrap", "prlimit", *(["setpriv"] if os.geteuid() == 0 else [])) if not _tool(t)
        ]
        if missing:
            _probe = f"{', '.join(missing)} not installed (Debian: bubblewrap, util-linux)"
        else:
            import subprocess  # noqa: PLC0415 - the probe only (a run that sandboxes nothing imports none)
            import tempfile  # noqa: PLC0415

            with tempfile.TemporaryDirectory(prefix="noetl-sandbox-probe-") as tmp:
                try:
                    box = confine(["/bin/true"], scratch=scratch_dir(tmp, "probe"), execution_id="probe")
                    r = subprocess.run(box.argv, env=box.env, cwd=box.cwd, capture_output=True, timeout=60)
                    err = r.stderr.decode(errors="replace").strip().splitlines()
                    _probe = "" if r.returncode == 0 else (err[-1] if err else f"exit code {r.returncode}")
                except (OSError, subprocess.TimeoutExpired) as e:  # libseccomp2 missing, bwrap not startable
                    _probe = str(e) or type(e).__name__
    return _probe or None


def available() -> bool:
    return unavailable_reason() is None


def require(what: str) -> bool:
    """True when the code must run sandboxed, False under the operator's ``env-only`` opt-out;
    raises ToolError(``sandbox_unavailable``) where the sandbox cannot be built (fail closed)."""
    if env_only():
        return False
    why = unavailable_reason()
    if why:
        raise ToolError(
            f"{what}: this code runs only in the OS sandbox (bubblewrap), which this host cannot "
            f"build: {why} (set {ISOLATION_ENV}=env-only to run it with a scrubbed environment only)",
            kind=UNAVAILABLE,
        )
    return True


def clean_env(home: str | None) -> dict[str, str]:
    """The environment of an unsandboxed (``env-only``) generated process: an allowlist, never the
    worker's secrets."""
    keep = ("PATH", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "PYTHONPATH")
    env = {k: os.environ[k] for k in keep if k in os.environ}
    env.setdefault("PATH", "/usr/local/bin:/usr/bin:/bin")
    if home:
        env.update(HOME=home, TMPDIR=home, NOETL_DAGSTER_HOME=home)
    return env


# -- a task's code ---------------------------------------------------------------------------------
def wanted(ctx: object) -> bool:
    """Whether a task's code runs sandboxed: a generated playbook's always, and any playbook's whose
    isolation (tenant/project policy or ``executor.spec.isolation``) is ``sandbox``."""
    return bool(getattr(ctx, "restricted", False)) or getattr(ctx, "isolation", None) == "sandbox"


def task_scratch(ctx: object, what: str) -> str | None:
    """The scratch folder of the task's execution when its code runs sandboxed (None when it does
    not, or under the operator's ``env-only`` opt-out); fails closed (:func:`require`)."""
    if not wanted(ctx) or not require(what):
        return None
    execution_id = str(getattr(ctx, "execution_id", ""))
    own = getattr(ctx, "scope_dir", None) or os.path.join(
        str(getattr(ctx, "data_dir", ".noetl")), "work", execution_id
    )
    return scratch_dir(own, execution_id, str(getattr(ctx, "tenant", None) or "default"))


def task_command(
    ctx: object,
    argv: list[str],
    scratch: str,
    env: Mapping[str, str] | None = None,
    cwd: str | None = None,
    proxy_socket: str | None = None,
) -> Confined:
    """``argv`` of a task confined in ``scratch`` (from :func:`task_scratch`), its network the
    egress proxy of :func:`task_egress` (none without it)."""
    return confine(argv, scratch=scratch, execution_id=str(getattr(ctx, "execution_id", "")),
                   tenant=str(getattr(ctx, "tenant", None) or "default"), env=env, cwd=cwd,
                   proxy_socket=proxy_socket, limits=Limits.from_env())  # fmt: skip


@contextmanager
def task_egress(ctx: object) -> Iterator[str | None]:
    """The egress proxy's socket for a sandboxed task while it runs: hosts of the execution's grant
    (``allow_hosts``); None (no network at all) when it lists none."""
    hosts = getattr(ctx, "allow_hosts", None)
    if not hosts:
        yield None
        return
    from noetl_dagster.tools.egress import EgressProxy  # noqa: PLC0415

    uid = outside_uid(str(getattr(ctx, "execution_id", "")), str(getattr(ctx, "tenant", None) or "default"))
    refused: list[str] = []

    def on_refuse(message: str) -> None:
        refused.append(message)
        log = getattr(ctx, "log", None)
        if log:
            log(message)

    try:
        with EgressProxy(hosts, uid=uid, on_refuse=on_refuse) as proxy:
            yield proxy.socket_path
    finally:
        note = getattr(ctx, "note", None)
        if refused and note:  # outcome.meta of task.done: the refusals are in the execution's events
            note(egress_refused=refused[:20])
