"""Find sub-playbooks: by a path relative to the parent file, or by ``metadata.path``
among the playbooks of the catalog directories (the running file's directory by
default, plus ``--catalog DIR``)."""

from __future__ import annotations

import threading
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from noetl_dagster.dsl.source import read_text_file
from noetl_dagster.engine.ports import ToolError

if TYPE_CHECKING:
    from noetl_dagster.dsl.model import Playbook

MAX_SCAN_FILES = 5000
SUFFIXES = (".yaml", ".yml")


class Catalog:
    def __init__(self, dirs: Iterable[str | Path] = ()):
        self.dirs = [Path(d).resolve() for d in dirs]
        self._index: dict[str, Path] | None = None
        self._loaded: dict[Path, Playbook] = {}
        self._lock = threading.Lock()

    def add_dir(self, d: str | Path) -> None:
        p = Path(d).resolve()
        if p not in self.dirs:
            self.dirs.append(p)
            self._index = None

    def _build_index(self) -> dict[str, Path]:
        import yaml  # noqa: PLC0415 - only when a catalog is scanned (issue 35: a run of a cached playbook imports no YAML)

        loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
        index: dict[str, Path] = {}
        n = 0
        for root in self.dirs:
            for f in sorted(root.rglob("*")):
                if f.suffix not in SUFFIXES or not f.is_file():
                    continue
                n += 1
                if n > MAX_SCAN_FILES:
                    return index
                try:
                    doc = yaml.load(read_text_file(f), Loader=loader)  # bounded: a huge file is skipped
                except Exception:  # noqa: BLE001 - unreadable files are simply not in the catalog
                    continue
                if isinstance(doc, dict) and doc.get("kind") == "Playbook":
                    meta = doc.get("metadata") or {}
                    if isinstance(meta, dict) and meta.get("path"):
                        index.setdefault(str(meta["path"]).strip("/"), f)
        return index

    def _load(self, f: Path) -> Playbook:
        with self._lock:
            if f not in self._loaded:
                from noetl_dagster.dsl.files import load_playbook  # noqa: PLC0415 - PyYAML: a catalog lookup only

                self._loaded[f] = load_playbook(f)
            return self._loaded[f]

    def find(self, ref: str, base_dir: str | None = None) -> Playbook:
        ref = str(ref).strip()
        if base_dir:
            cand = Path(base_dir) / ref
            for c in (cand, *(cand.with_name(cand.name + s) for s in SUFFIXES)):
                if c.is_file():
                    return self._load(c.resolve())
        p = Path(ref)
        if p.is_absolute() and p.is_file():
            return self._load(p)
        with self._lock:
            if self._index is None:
                self._index = self._build_index()
            index = self._index
        key = ref.strip("/")
        if key in index:
            return self._load(index[key])
        for k, f in index.items():  # a catalog path given relative to a common prefix
            if k.endswith("/" + key) or key.endswith("/" + k):
                return self._load(f)
        raise ToolError(
            f"sub-playbook {ref!r} not found (looked relative to {base_dir} and by metadata.path in "
            f"{', '.join(map(str, self.dirs)) or 'no catalog directory'})",
            kind="playbook_not_found",
        )
