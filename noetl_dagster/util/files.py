"""The one bounded reader for files a command is given (playbooks, flows, workloads, lists, event files).

A path names anything: a FIFO blocks ``open`` for ever, ``/dev/zero`` reads until memory runs out,
a regular file may grow while it is read. :func:`read_bounded` opens without blocking, checks the
opened file itself (``fstat``: no race with a rename), accepts only a regular file, and reads at most
``limit + 1`` bytes, so a file that is or becomes too large is refused without being held. A refusal
is an :class:`InputFileError` (a ``ValueError``: exit 2 at the CLI) with a one-line message.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


class InputFileError(ValueError):
    """A file a command cannot read: missing, unreadable, not a regular file or over the size limit.
    ``rule``: ``file-not-found``, ``cannot-read``, ``not-a-file`` or ``max-bytes``."""

    def __init__(self, path: str, rule: str, message: str):
        super().__init__(f"{path}: {message}")
        self.path, self.rule, self.message = path, rule, message


def read_bounded(path: str | os.PathLike[str], limit: int, *, what: str = "file") -> bytes:
    """The bytes of the regular file ``path``, at most ``limit`` of them; else :class:`InputFileError`.
    ``what`` names the file in the message (``--workload file``, ``playbook``)."""
    p = str(Path(path))
    try:  # O_NONBLOCK: opening a FIFO with no writer must not wait for one
        fd = os.open(p, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise InputFileError(p, "file-not-found", f"no such {what}") from None
    except OSError as e:
        raise InputFileError(p, "cannot-read", f"cannot read the {what}: {e.strerror or e}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            kind = next((name for test, name in _KINDS if test(st.st_mode)), "not a regular file")
            raise InputFileError(p, "not-a-file", f"the {what} is {kind}, not a regular file")
        if st.st_size > limit:
            raise InputFileError(p, "max-bytes", f"the {what} is {st.st_size} bytes; the limit is {limit}")
        chunks: list[bytes] = []
        left = limit + 1  # one byte past the limit tells "too large" (a file growing, /proc's size 0)
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        if left <= 0:
            raise InputFileError(
                p, "max-bytes", f"the {what} is more than {limit} bytes; the limit is {limit}"
            )
        return b"".join(chunks)
    except OSError as e:
        raise InputFileError(p, "cannot-read", f"cannot read the {what}: {e.strerror or e}") from None
    finally:
        os.close(fd)


def read_bounded_text(path: str | os.PathLike[str], limit: int, *, what: str = "file") -> str:
    """:func:`read_bounded` decoded as UTF-8; invalid UTF-8 is an :class:`InputFileError` naming the byte."""
    data = read_bounded(path, limit, what=what)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data[: e.start].count(b"\n") + 1
        raise InputFileError(
            str(path), "not-utf8", f"the {what} is not UTF-8 text ({e.reason} at byte {e.start}, line {line})"
        ) from None
