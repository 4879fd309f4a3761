"""Parsed playbooks cached by file hash: a code location loads without re-validating unchanged files.

Every Dagster process that loads the code location (the code server, each run worker, each
per-step run) used to parse and validate every playbook again; on the 2-core build machine that
was most of the load's CPU (docs/capacity.md, "Request to start"). ``load_playbook_cached`` keeps
the validated model of a file, pickled, under a key of everything the result depends on:

* the file's bytes and its resolved path (the model records ``source_file``);
* the code of the ``dsl`` and ``util`` packages (size and mtime of their modules; ``dsl/kinds.py``
  holds the built-in kinds' table and raw keys) and this package's version;
* what can be installed beside it (plugin kinds by entry point, the kinds' optional extras): the
  mtime of every ``sys.path`` directory (see :func:`_installed_fingerprint`), and the kinds
  registered in this process; the limits read from the environment (``NOETL_MAX_*``, ``NOETL_YAML_*``).

A hit imports neither PyYAML nor the parser and builds no validator: the models are declared with
``defer_build`` and unpickling sets their fields without validating (``noetl-dagster run`` of an
unchanged playbook, issue 35). ``ready=True`` (``run``'s local runner) unpickles the same entry into
``dsl.ready``'s pydantic-free twins of the model classes: not even pydantic is imported.

Only valid playbooks are cached, so an invalid file is reported with its ``FILE:LINE: RULE`` lines
on every load. The directory is ``$NOETL_DAGSTER_PLAYBOOK_CACHE`` (``0``/``off`` turns the cache
off), else ``$XDG_CACHE_HOME/noetl-dagster/playbooks`` (``~/.cache/...``). Entries are written
atomically; an unreadable entry is a miss. The cache holds pickles: like the virtualenv, it must
be writable only by the user that runs Dagster (it is created with mode 0700).
"""

from __future__ import annotations

import hashlib
import os
import pickle
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from noetl_dagster.dsl.source import YamlLimits
from noetl_dagster.util.files import InputFileError, read_bounded
from noetl_dagster.util.lazylog import LazyLogger

if TYPE_CHECKING:
    from noetl_dagster.dsl.model import Playbook

log = LazyLogger("noetl_dagster.translator")

CACHE_ENV = "NOETL_DAGSTER_PLAYBOOK_CACHE"
_FORMAT = b"noetl-playbook-cache/1"
_code_key: bytes | None = None
_DIST_SUFFIXES = (".dist-info", ".egg-info", ".egg-link", ".pth")


def load_playbook(path: str | os.PathLike[str]) -> Playbook:
    """The parser (PyYAML, the validators), imported on a miss only."""
    from noetl_dagster.dsl.files import load_playbook as parse  # noqa: PLC0415 - start-up, see module doc

    return parse(path)


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
    """The dsl and util packages' modules (size, mtime) and the package version: a new parser is a new key."""
    global _code_key
    if _code_key is None:
        from noetl_dagster.util.version import package_version  # noqa: PLC0415 - no importlib.metadata

        h = hashlib.sha256(_FORMAT)
        try:
            h.update(package_version().encode())
        except Exception:  # noqa: BLE001 - not installed as a distribution: the files still key it
            pass
        pkg = Path(__file__).resolve().parent.parent
        for sub in ("dsl", "util"):
            root = pkg / sub
            for f in sorted(root.rglob("*.py")):
                st = f.stat()
                h.update(f"{f.relative_to(pkg)}:{st.st_size}:{st.st_mtime_ns};".encode())
        _code_key = h.digest()
    return _code_key


def _installed_fingerprint() -> bytes:
    """What is installed beside this package, as cheaply as one directory listing per ``sys.path`` entry.

    Validation depends on the installed distributions in two ways: plugin kinds (the
    ``noetl_dagster.tools`` entry points; a kind name is also a raw-key hint for any mapping key
    of that name, dsl/parse.py) and the built-in kinds' optional extras (``missing_extra``). Reading
    them (importlib.metadata's scan of every distribution, ~15-40 ms; a spec lookup per extra) was
    most of a cache hit's cost. Both come from distributions, and installing, upgrading or removing
    one (pip, uv, an editable install) adds or removes its ``NAME-VERSION.dist-info`` (or
    ``.egg-info``, ``.egg-link``, ``.pth``) in a ``sys.path`` directory, where importlib.metadata
    finds it: the names of those entries, per ``sys.path`` directory, key everything the scan and
    the extras could answer (over-approximate: any install is a miss). Not directory mtimes: the cwd
    of ``python -c`` is on sys.path and changes all the time. The built-in kinds' table and raw keys
    are code of ``dsl/kinds.py`` (the code fingerprint). Not covered, as before: a plugin's entry
    points edited in place without reinstalling it."""
    parts = []
    for entry in sys.path:
        try:
            names = sorted(n for n in os.listdir(entry or ".") if n.endswith(_DIST_SUFFIXES))
        except NotADirectoryError:  # a zip on sys.path
            try:
                st = os.stat(entry)
                names = [f"{st.st_size}:{st.st_mtime_ns}"]
            except OSError:
                names = ["-"]
        except OSError:
            names = ["-"]
        parts.append(f"{entry}:{','.join(names)}")
    kinds = sys.modules.get("noetl_dagster.dsl.kinds")  # kinds registered in this process (register_tool)
    if kinds is not None:
        registered = sorted(n for n, tk in kinds._REGISTRY.items() if tk.source == "register_tool")
        parts.append(f"registered={','.join(registered)};generation={kinds.registry_generation()}")
    return "\n".join(parts).encode()


def _env_fingerprint() -> bytes:
    return ";".join(
        f"{k}={v}" for k, v in sorted(os.environ.items()) if k.startswith(("NOETL_MAX", "NOETL_YAML"))
    ).encode()


def cache_key(path: str | os.PathLike[str], data: bytes) -> str:
    h = hashlib.sha256(_code_fingerprint())
    for part in (str(Path(path).resolve()).encode(), data, _installed_fingerprint(), _env_fingerprint()):
        h.update(len(part).to_bytes(8, "big"))
        h.update(part)
    return h.hexdigest()


def load_playbook_cached(path: str | os.PathLike[str], *, ready: bool = False) -> Playbook:
    """``dsl.load_playbook(path)``, answered from the cache when the file and the parser are unchanged.

    ``ready=True``: a hit is returned in its ready-to-run form (``dsl.ready``: the same state in
    pydantic-free twins of the model classes, for the engine and the local runner; no pydantic
    imported); a miss returns the model it parsed either way."""
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
        data = entry.read_bytes()
        if ready:
            from noetl_dagster.dsl.ready import Playbook as ReadyPlaybook  # noqa: PLC0415 - start-up
            from noetl_dagster.dsl.ready import load_ready  # noqa: PLC0415

            try:
                pb = load_ready(data)
            except pickle.UnpicklingError:  # a class without a twin: the model itself, below
                pb = None
            if isinstance(pb, ReadyPlaybook):
                return pb  # type: ignore[return-value] - it answers as the model does (dsl/ready.py)
        pb = pickle.loads(data)  # noqa: S301 - our own entries, in a 0700 directory
        from noetl_dagster.dsl.model import Playbook  # noqa: PLC0415 - imported by the unpickling already

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
    import tempfile  # noqa: PLC0415 - a miss only (with shutil and random: not for a hit, issue 35)

    try:
        entry.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd, tmp = tempfile.mkstemp(dir=entry.parent, prefix=".tmp-")
        with os.fdopen(fd, "wb") as fh:
            fh.write(pickle.dumps(pb, protocol=pickle.HIGHEST_PROTOCOL))
        os.replace(tmp, entry)
    except OSError as e:  # a read-only home: parse every time, as before
        log.debug("noetl: playbook cache not written (%s)", e)
