"""`run`'s console output without importing rich when rich would print no escape codes (issue 35).

rich (~30 ms to import, its table ~10 ms more) is what draws the progress lines and the summary
table. When the output is not a terminal (a pipe, a file, CI) rich writes plain text: the same
characters a few lines of Python write. This module writes those characters itself, only in the
cases where it is sure to match rich exactly, and says ``None`` otherwise, so the caller uses rich:

* the stream is not a terminal and nothing forces one (``FORCE_COLOR``, ``TTY_COMPATIBLE``, a
  Jupyter kernel): rich's ``Console.is_terminal`` is then False and it has no colour system;
* every text is printable ASCII (one cell per character) with no rich markup tag (``[bold]``) and
  no emoji code (``:smile:``) that rich would replace;
* the table fits the console's width (rich's width: ``COLUMNS``, else the first standard stream
  that is a terminal, else 80), so no column is shrunk or wrapped.

tests/commands/test_cli_output.py compares these lines with rich's, also on generated inputs.
"""

from __future__ import annotations

import builtins
import os
import re
from typing import IO

# rich.markup's tag: `[` then a letter, `#`, `/` or `@`
_TAG = re.compile(r"\[[a-z#/@]")
# a `:name:` rich could turn into an emoji: every emoji name is made of these characters
_EMOJI = re.compile(r":[a-z0-9_+\-.!#&()*\u2019\u00e3\u00e5\u00e7\u00e9\u00ed\u00f4]+:")
_WORDS = re.compile(r"\s*\S+\s*")
_PRINTABLE = re.compile(r"[ -~]*")


def is_plain(stream: IO[str]) -> bool:
    """True when rich would write no escape codes to ``stream`` (see the module docstring)."""
    env = os.environ
    if "FORCE_COLOR" in env or env.get("TTY_COMPATIBLE", "0") != "0" or hasattr(builtins, "get_ipython"):
        return False
    if "JUPYTER_COLUMNS" in env or "JUPYTER_LINES" in env:
        return False
    isatty = getattr(stream, "isatty", None)
    try:
        return isatty is not None and not isatty()
    except ValueError:  # a closed stream: rich says "not a terminal" too
        return True


def console_width() -> int:
    """rich's ``Console().width`` on Linux: ``COLUMNS``, else a terminal's width on fd 0, 1 or 2, else 80."""
    columns = os.environ.get("COLUMNS")
    if columns is not None and columns.isdigit():
        return int(columns)
    width = 0
    for fd in (0, 1, 2):
        try:
            width = os.get_terminal_size(fd)[0]
        except (AttributeError, ValueError, OSError):
            continue
        break
    return width or 80


def safe(text: str) -> bool:
    """Text rich prints as it is: printable ASCII, no markup tag, no escaped bracket (rich prints
    ``\\[`` as ``[``), no emoji code."""
    return (
        _PRINTABLE.fullmatch(text) is not None
        and "\\[" not in text
        and not _TAG.search(text)
        and not _EMOJI.search(text.lower())
    )


def wrap(text: str, width: int) -> list[str]:
    """rich's word wrap of one line (``rich._wrap.divide_line`` with folding, then ``rstrip_end``)."""
    breaks: list[int] = []
    offset = 0
    for m in _WORDS.finditer(text):
        start, word = m.start(), m.group()
        length = len(word.rstrip())
        if width - offset >= length:
            offset += len(word)
        elif length > width:  # longer than a line: folded into chunks of the width
            chunks = [word[i : i + width] for i in range(0, len(word), width)]
            for i, chunk in enumerate(chunks):
                if start:
                    breaks.append(start)
                if i == len(chunks) - 1:
                    offset = len(chunk)
                else:
                    start += len(chunk)
        elif offset and start:
            breaks.append(start)
            offset = len(word)
    lines = [text[a:b] for a, b in zip([0, *breaks], [*breaks, len(text)], strict=True)]
    out = []
    for line in lines:
        if len(line) > width:  # trailing whitespace past the width goes
            trail = len(line) - len(line.rstrip())
            line = line[: len(line) - min(trail, len(line) - width)]
        out.append(line)
    return out


def table(headers: list[str], rows: list[tuple[str, ...]], right: set[int], width: int) -> list[str] | None:
    """rich's ``Table`` (box HEAVY_HEAD, padding 1, no colour) when it fits ``width``, else None."""
    if not rows or not all(safe(c) and c == c.strip() for row in [headers, *rows] for c in row):
        return None
    widths = [max(len(r[i]) for r in [headers, *rows]) for i in range(len(headers))]
    if sum(widths) + 3 * len(widths) + 1 > width:
        return None

    def line(cells: tuple[str, ...] | list[str], edge: str) -> str:
        padded = [
            c.rjust(w) if i in right else c.ljust(w)
            for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        ]
        return edge + edge.join(f" {c} " for c in padded) + edge

    return [
        "\u250f" + "\u2533".join("\u2501" * (w + 2) for w in widths) + "\u2513",
        line(headers, "\u2503"),
        "\u2521" + "\u2547".join("\u2501" * (w + 2) for w in widths) + "\u2529",
        *(line(r, "\u2502") for r in rows),
        "\u2514" + "\u2534".join("\u2500" * (w + 2) for w in widths) + "\u2518",
    ]


def text_lines(text: str, width: int) -> list[str] | None:
    """One printed line of plain text, wrapped as rich wraps it; None when rich would change it."""
    return wrap(text, width) if safe(text) else None
