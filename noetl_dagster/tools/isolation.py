"""Process isolation for code of generated playbooks (python, shell, script).

A scrubbed environment is not enough: any process of the worker's user can read
``/proc/<pid>/environ`` of the worker (and of whatever started it), which holds
the credentials the worker was given. :func:`isolated` wraps a command so it runs
in its own user, PID and mount namespaces with a fresh ``/proc``: it sees only its
own processes (its parent is pid 0, outside), and with every capability dropped
(bounding set emptied, ``no_new_privs``) it cannot unmount that ``/proc`` to see
the worker's again. Unprivileged user namespaces are a kernel feature; where they
are off, the call fails closed (``isolation_unavailable``) unless the operator set
``NOETL_GENERATED_ISOLATION=env-only`` (then only the environment is scrubbed).

The launcher is a few lines of Python run with ``-I`` (no site, no environment
variables read): it does not import this package, costs one interpreter start
(~25-45 ms here) and execs the command, so the command's exit code and output are
the launcher's.
"""

from __future__ import annotations

import os
import subprocess
import sys

from noetl_dagster.tools.registry import ToolError

ISOLATION_ENV = "NOETL_GENERATED_ISOLATION"
EXIT_UNAVAILABLE = 97  # the launcher could not build the namespaces

_LAUNCHER = r"""
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
uid, gid = os.getuid(), os.getgid()
if libc.unshare(0x10000000 | 0x20000000 | 0x00020000) != 0:  # CLONE_NEWUSER | CLONE_NEWPID | CLONE_NEWNS
    sys.stderr.write("isolation: unshare failed: %s\n" % os.strerror(ctypes.get_errno())); sys.exit(97)
try:
    for name, text in (("setgroups", "deny"), ("uid_map", "0 %d 1" % uid), ("gid_map", "0 %d 1" % gid)):
        with open("/proc/self/" + name, "w") as fh:
            fh.write(text)
except OSError as e:
    sys.stderr.write("isolation: id map failed: %s\n" % e); sys.exit(97)
pid = os.fork()
if pid == 0:  # pid 1 of the new namespace
    if (libc.mount(b"none", b"/", None, 16384 | 262144, None) != 0  # MS_REC | MS_PRIVATE
            or libc.mount(b"proc", b"/proc", b"proc", 2 | 4 | 8, None) != 0):  # nosuid, nodev, noexec
        sys.stderr.write("isolation: mounting /proc failed: %s\n" % os.strerror(ctypes.get_errno())); os._exit(97)
    cap = 0
    while libc.prctl(24, cap, 0, 0, 0) == 0:  # PR_CAPBSET_DROP: exec keeps no capability
        cap += 1
    libc.prctl(38, 1, 0, 0, 0)  # PR_SET_NO_NEW_PRIVS
    try:
        os.execvp(sys.argv[1], sys.argv[1:])
    except OSError as e:
        sys.stderr.write("isolation: cannot start %r: %s\n" % (sys.argv[1], e.strerror)); os._exit(127)
while True:
    try:
        _, status = os.waitpid(pid, 0)
        break
    except InterruptedError:
        continue
sys.exit(os.waitstatus_to_exitcode(status) if hasattr(os, "waitstatus_to_exitcode") else status >> 8)
"""

_probe: bool | None = None


def env_only() -> bool:
    return os.environ.get(ISOLATION_ENV, "").strip().lower() == "env-only"


def available() -> bool:
    """Whether this host lets the worker build the namespaces (probed once per process)."""
    global _probe
    if _probe is None:
        try:
            r = subprocess.run([sys.executable, "-I", "-c", _LAUNCHER, "true"], capture_output=True, timeout=30,
                               env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")})  # fmt: skip
            _probe = r.returncode == 0
        except (OSError, subprocess.TimeoutExpired):
            _probe = False
    return _probe


def isolated(argv: list[str], what: str) -> list[str]:
    """``argv`` run in fresh user/PID/mount namespaces (see the module doc); fails closed."""
    if env_only():
        return argv
    if not available():
        raise ToolError(
            f"{what}: a generated playbook's code runs only in an isolated process, and this host does not "
            f"allow user namespaces (set {ISOLATION_ENV}=env-only to run it with a scrubbed environment only)",
            kind="isolation_unavailable",
        )
    return [sys.executable, "-I", "-c", _LAUNCHER, *argv]


def clean_env(home: str | None) -> dict[str, str]:
    """The environment of a generated playbook's process: an allowlist, never the worker's secrets."""
    keep = ("PATH", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "PYTHONPATH")
    env = {k: os.environ[k] for k in keep if k in os.environ}
    env.setdefault("PATH", "/usr/local/bin:/usr/bin:/bin")
    if home:
        env.update(HOME=home, TMPDIR=home, NOETL_DAGSTER_HOME=home)
    return env
