"""Parsed playbooks cached by file hash: a code location loads without re-validating unchanged files.

Every Dagster process that loads the code location (the code server, each run worker, each
per-step run) used to parse and validate every playbook again; on the 2-core build machine that
was most of the load's CPU (docs/capacity.md, "Request to start"). ``load_playbook_cached`` keeps
the validated model of a file, pickled, under a key of everything the result depends on:

* the file's bytes and its resolved path (the model records ``source_file``);
* the code of the ``dsl`` package (size and mtime of its modules) and this package's version;
* the tool kinds that can be named (entry points, names and targets, and whether each kind's
  optional extra is installed) and the limits read from the environment (``NOETL_MAX_*``,
  ``NOETL_YAML_*``).

Only valid playbooks are cached, so an invalid file is reported with its ``FILE:LINE: RULE`` lines
on every load. The directory is ``$NOETL_DAGSTER_PLAYBOOK_CACHE`` (``0``/``off`` turns the cache
off), else ``$XDG_CACHE_HOME/noetl-dagster/playbooks`` (``~/.cache/...``). Entries are written
atomically; an unreadable entry is a miss. The cache holds pickles: like the virtualenv, it must
be writable only by the user that runs Dagster (it is created with mode 0700).
"""

from __future__ import annotations

import hashlib
import logging
import os
import pickle
import tempfile
from pathlib import Path

from noetl_dagster.dsl import load_playbook
from noetl_dagster.dsl.files import InputFileError, read_bounded
from noetl_dagster.dsl.loader import YamlLimits
from noetl_dagster.dsl.model import Playbook

log = logging.getLogger("noetl_dagster.translator")

CACHE_ENV = "NOETL_DAGSTER_PLAYBOOK_CACHE"
_FORMAT = b"noetl-playbook-cache/1"
_code_key: bytes | None = None


def cache_dir() -> Path | None:
    """Where entries live, or None when the cache is off."""
    raw = os.environ.get(CACHE_ENV, "").strip()
    if raw.lower() in ("0", "off", "false", "no"):
        return None
    if raw:
        return Path(raw)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "noetl-dagster" / "playbooks"


def _code_fingerprint() -> bytes:
    """The dsl package's modules (size, mtime) and the package version: a new parser is a new key."""
    global _code_key
    if _code_key is None:
        import noetl_dagster.dsl as dsl_pkg  # noqa: PLC0415

        h = hashlib.sha256(_FORMAT)
        try:
            from importlib.metadata import version  # noqa: PLC0415

            h.update(version("noetl-dagster").encode())
        except Exception:  # noqa: BLE001 - not installed as a distribution: the files still key it
            pass
        root = Path(dsl_pkg.__file__).parent
        for f in sorted(root.rglob("*.py")):
            st = f.stat()
            h.update(f"{f.relative_to(root)}:{st.st_size}:{st.st_mtime_ns};".encode())
        _code_key = h.digest()
    return _code_key


def _kinds_fingerprint() -> bytes:
    """Each kind's entry point, and whether its optional extra is installed: a playbook validated
    with `[quantum]` present must not load from the cache once it is gone (missing-extra)."""
    from noetl_dagster.dsl.kinds import BUILTIN_KINDS, _entry_points, known_kinds, missing_extra  # noqa: PLC0415

    eps = _entry_points()
    return ";".join(
        f"{n}={BUILTIN_KINDS.get(n) or (eps[n].value if n in eps else 'registered')}"
        f"{'!missing' if missing_extra(n) else ''}"
        for n in sorted(known_kinds())
    ).encode()


def _env_fingerprint() -> bytes:
    return ";".join(f"{k}={v}" for k, v in sorted(os.environ.items()) if k.startswith(("NOETL_MAX", "NOETL_YAML"))).encode()


def cache_key(path: str | os.PathLike[str], data: bytes) -> str:
    h = hashlib.sha256(_code_fingerprint())
    for part in (str(Path(path).resolve()).encode(), data, _kinds_fingerprint(), _env_fingerprint()):
        h.update(len(part).to_bytes(8, "big"))
        h.update(part)
    return h.hexdigest()


def load_playbook_cached(path: str | os.PathLike[str]) -> Playbook:
    """``dsl.load_playbook(path)``, answered from the cache when the file and the parser are unchanged."""
    folder = cache_dir()
    p = Path(path)
    if folder is None or p.suffix == ".flow" or not p.is_file():
        return load_playbook(p)
    try:  # the bounded reader: a file over the playbook size limit is refused by the loader, unread here
        data = read_bounded(p, YamlLimits.from_env().max_bytes, what="playbook")
    except InputFileError:
        return load_playbook(p)  # which reports it
    key = cache_key(p, data)
    entry = folder / key[:2] / f"{key}.pickle"
    try:
        pb = pickle.loads(entry.read_bytes())  # noqa: S301 - our own entries, in a 0700 directory
        if isinstance(pb, Playbook):
            return pb
    except FileNotFoundError:
        pass
    except Exception as e:  # noqa: BLE001 - a torn or foreign entry is a miss
        log.debug("noetl: playbook cache entry %s unreadable (%s); parsing %s", entry, e, p)
    pb = load_playbook(p)  # raises PlaybookInvalid: invalid files are never cached
    _store(entry, pb)
    return pb


def _store(entry: Path, pb: Playbook) -> None:
    try:
        entry.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd, tmp = tempfile.mkstemp(dir=entry.parent, prefix=".tmp-")
        with os.fdopen(fd, "wb") as fh:
            fh.write(pickle.dumps(pb, protocol=pickle.HIGHEST_PROTOCOL))
        os.replace(tmp, entry)
    except OSError as e:  # a read-only home: parse every time, as before
        log.debug("noetl: playbook cache not written (%s)", e)

