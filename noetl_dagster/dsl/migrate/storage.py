"""Pipelines and storage: a step's task list, and ``save:`` / ``sink:`` blocks -> storage tasks after
the main task (postgres, duckdb, python, http, parquet/arrow/iceberg; event logs dropped)."""

from __future__ import annotations

import re
from typing import Any

from ruamel.yaml.comments import CommentedMap, CommentedSeq
from ruamel.yaml.scalarstring import LiteralScalarString

from .base import MigratorBase
from .constants import _TABLE, EVENT_LOG_KINDS, STORAGE_KIND_KEYS, STORAGE_KINDS
from .pieces import _task_items, _TaskRef
from .report import _Refuse
from .sql import _insert_sql
from .templates import (
    NameRef,
    Resolver,
    TemplateRewriteError,
    _group,
    _tmpl,
    free_names,
    rewrite_template,
    single_expression,
)
from .yamltree import _cm, _index, _plain, _pop, _restyle, _walk_strings


def _storage_kind(cfg: Any) -> str | None:
    if not isinstance(cfg, dict):
        return None
    tool, storage = cfg.get("tool"), cfg.get("storage")
    for cand in (tool.get("kind") if isinstance(tool, dict) else tool,
                 storage.get("type") if isinstance(storage, dict) else storage,
                 cfg.get("backend"), cfg.get("kind"), cfg.get("type")):  # fmt: skip
        if isinstance(cand, str):
            return cand.lower()
    return None


class StorageMixin(MigratorBase):
    """Rules over a step's pipeline: the main task, storage tasks, the pass-through result task."""

    # -- storage (sink / save) -----------------------------------------------------
    def _pipeline(self, s: CommentedMap) -> list[_TaskRef]:
        tasks = _task_items(s.get("tool"))
        if not tasks:
            raise _Refuse("the step has no tool to attach storage to", s, "step")
        return tasks

    def _set_pipeline(self, s: CommentedMap, tasks: list[_TaskRef]) -> None:
        """Write ``tasks`` back as the step's pipeline (list form; label-maps kept where used)."""
        if len(tasks) == 1 and tasks[0].style == "single":
            return
        labelmap_file = any(t.style == "labelmap" for t in tasks)
        seq = s["tool"] if isinstance(s.get("tool"), list) else CommentedSeq()
        items = []
        for t in tasks:
            body = t.body
            if t.style == "labelmap" or labelmap_file or body.get("kind") == "workbook":
                items.append(_cm((t.label, body)))
            else:
                if body.get("name") != t.label:
                    if "name" in body:
                        body["name"] = t.label
                    else:
                        body.insert(0, "name", t.label)
                items.append(body)
        del seq[:]
        seq.extend(items)
        if not isinstance(s.get("tool"), list):
            pos = _index(s, "tool")
            comment = s.ca.items.pop("tool", None)
            s.pop("tool")
            s.insert(pos, "tool", seq)
            if comment is not None:
                s.ca.items["tool"] = comment

    def _main_task(self, s: CommentedMap) -> tuple[list[_TaskRef], _TaskRef]:
        tasks = self._pipeline(s)
        if len(tasks) != 1:
            raise _Refuse("storage blocks are translated for one-task steps only", s, "tool")
        main = tasks[0]
        if main.style == "single":
            main.label = str(main.body.get("name")) if main.body.get("name") and main.body.get("kind") != "workbook" \
                else s["step"]  # fmt: skip
            main.style = "name"
        return tasks, main

    def _step_sink(self, s: CommentedMap, key: str, path: tuple) -> None:
        try:
            cfg = s[key]
            if _storage_kind(cfg) in EVENT_LOG_KINDS:
                self.note("info", key, f"`{key}` to the event log needs no task: every result is recorded as an "
                          "event", s, key, (*path, key))  # fmt: skip
                _pop(s, key)
                return
            tasks, main = self._main_task(s)
            era = "v1" if key == "save" else "v2"
            built = self._storage_task(cfg, main, era, s, key)
            if built is None:  # event-log sinks: every result is an event already
                _pop(s, key)
                return
            label = self._fresh_label(f"{s['step']}_{key}", tasks)
            tasks.append(_TaskRef(label, built, "name"))
            self._add_passthrough(s, tasks, main)
            self._set_pipeline(s, tasks)
            _pop(s, key)
        except _Refuse as e:
            self.refuse(e, key, s, key, (*path, key))

    @staticmethod
    def _fresh_label(base: str, tasks: list[_TaskRef]) -> str:
        labels = {t.label for t in tasks}
        label, n = base, 2
        while label in labels:
            label, n = f"{base}_{n}", n + 1
        return label

    def _result_referenced(self, step_name: str, own: CommentedMap) -> bool:
        """Whether any template outside the step reads the step's result by name."""
        found = False

        def fn(text: str, path: tuple) -> None:
            nonlocal found
            if found or step_name not in text:
                return None
            try:
                found = any(r.name == step_name for r in free_names(text))
            except TemplateRewriteError:
                found = True
            return None

        for s in self.doc.get("workflow") or []:
            if s is not own and isinstance(s, dict):
                _walk_strings(s, fn)
        for key in ("workbook", "workload"):
            if key in self.doc:
                _walk_strings(self.doc[key], fn)
        return found

    def _add_passthrough(self, s: CommentedMap, tasks: list[_TaskRef], main: _TaskRef) -> None:
        """Keep the step's result (the main task's) when storage tasks now run after it."""
        if any(t.label.endswith("_result") and t.body.get("kind") == "noop" for t in tasks):
            return
        if not self._result_referenced(s["step"], s):
            return
        label = self._fresh_label(f"{s['step']}_result", tasks)
        tasks.append(_TaskRef(label, _cm(kind="noop", result=_tmpl(f"results.{main.label}")), "name"))

    def _storage_task(
        self, cfg: Any, main: _TaskRef, era: str, s: CommentedMap, key: str
    ) -> CommentedMap | None:
        """A legacy sink / save block -> a storage task (None for event-log sinks)."""
        if not isinstance(cfg, dict):
            raise _Refuse(f"`{key}` is not a mapping", s, key)
        params: dict[str, Any] = {}
        kind = None
        tool = cfg.get("tool")
        if isinstance(tool, dict):
            kind = tool.get("kind") or tool.get("type")
            params.update({k: v for k, v in tool.items() if k not in ("kind", "type")})
        elif isinstance(tool, str):
            kind = tool
        storage = cfg.get("storage")
        if isinstance(storage, dict):
            kind = kind or storage.get("type") or storage.get("kind")
            params.update({k: v for k, v in storage.items() if k not in ("type", "kind")})
        elif isinstance(storage, str):
            kind = kind or storage
        for k in ("backend", "kind", "type"):
            if kind is None and isinstance(cfg.get(k), str):
                kind = cfg[k]
        params.update(
            {k: v for k, v in cfg.items() if k not in ("tool", "storage", "backend", "kind", "type")}
        )
        if kind is None:
            raise _Refuse(f"`{key}` names no storage kind", s, key)
        kind = str(kind).lower()
        if kind in EVENT_LOG_KINDS:
            self.note("info", key, f"`{key}` to the event log needs no task: every result is recorded as an event",
                      s, key)  # fmt: skip
            return None
        main_kind = str(main.body.get("kind"))
        resolver = self._sink_resolver(main.label, main_kind, era)

        def rw(value: Any) -> Any:
            if isinstance(value, str):
                return _restyle(value, rewrite_template(value, resolver))
            if isinstance(value, dict):
                out = CommentedMap()
                for k, v in value.items():
                    out[k] = rw(v)
                return out
            if isinstance(value, list):
                return CommentedSeq([rw(v) for v in value])
            return value

        data = None
        for k in ("args", "data", "from"):
            if k in params and data is None:
                data = params.pop(k)
        statement = None
        for k in ("statement", "command", "commands", "query", "sql"):
            if k in params and statement is None:
                statement = params.pop(k)
        auth = params.pop("auth", params.pop("credential", None))
        table = params.pop("table", None)
        mode = str(params.pop("mode", "insert") or "insert").lower()
        keys = params.pop("key", params.pop("keys", None))
        task = CommentedMap()
        task["kind"] = kind
        if kind in ("postgres", "duckdb"):
            if kind == "postgres":
                if auth is None:
                    raise _Refuse("a postgres sink without `auth` (a credential name)", s, key)
                task["auth"] = auth
            if statement is not None:
                if data is not None and not isinstance(data, dict):
                    raise _Refuse("a sink statement's data is not a mapping", s, key)
                task["command"] = rw(self._statement_with_data(statement, data, kind, s, key))
            elif table is not None and isinstance(data, dict):
                if not _TABLE.match(str(table)):
                    raise _Refuse(f"table {table!r} is not a plain (schema.)name", s, key)
                task["command"] = LiteralScalarString(
                    _insert_sql(str(table), list(data), mode, keys, kind, s, key)
                )
                task["params"] = rw(data)
            else:
                raise _Refuse(f"a {kind} sink needs `statement` or `table` with a data mapping", s, key)
            extra = sorted(set(params) - {"database", "db_path", "schema", "spec", "batch", "chunk_size"})
            if extra:
                raise _Refuse(f"{kind} sink keys {extra} have no counterpart", s, key)
            for k in ("database", "db_path", "schema"):
                if k in params:
                    task[k] = rw(params[k])
        elif kind == "python":
            code = params.pop("code", None)
            if code is None:
                raise _Refuse("a python sink without `code`", s, key)
            task["code"] = code
            if data is not None:
                task["input"] = rw(data) if isinstance(data, dict) else _cm(data=rw(data))
            if params:
                raise _Refuse(f"python sink keys {sorted(params)} have no counterpart", s, key)
        elif kind == "http":
            for k in ("method", "url", "endpoint", "headers", "params", "timeout"):
                if k in params:
                    task[k] = rw(params.pop(k))
            task.setdefault("method", "POST")
            if data is not None:
                task["json"] = rw(data)
            if params:
                raise _Refuse(f"http sink keys {sorted(params)} have no counterpart", s, key)
        elif kind in STORAGE_KINDS:
            # the table tools write records by reference: `table` names the resource, one sink call is one record
            if table is not None:
                params.setdefault("resource", table)
            extra = sorted(set(params) - STORAGE_KIND_KEYS)
            if extra:
                raise _Refuse(f"{kind} sink keys {extra} have no counterpart", s, key)
            if "uri" not in params and "resource" not in params:
                raise _Refuse(f"a {kind} sink needs `uri` or `table`", s, key)
            for k, v in params.items():
                task[k] = rw(v)
            if isinstance(data, dict):
                task["data"] = CommentedSeq([rw(data)])
            elif data is not None:
                task["data"] = rw(data)
            if mode not in ("insert", "append"):
                task["mode"] = "overwrite" if mode in ("replace", "overwrite") else mode
        else:
            raise _Refuse(f"storage kind {kind!r} has no standard tool", s, key)
        return task

    def _sink_resolver(self, main_label: str, main_kind: str, era: str) -> Resolver:
        """Inside a storage task, legacy result names read the main task's result."""
        whole = f"results.{main_label}"
        if main_kind == "http":
            unwrapped = f"{whole}.data"
        elif main_kind in ("postgres", "duckdb"):
            unwrapped = whole
        else:
            unwrapped = f"({whole}.data if {whole}.data is defined else {whole})"

        def resolver(ref: NameRef) -> tuple[str, int] | None:
            if ref.name in ("response", "this"):
                return whole, 0
            if ref.name == "result":
                return (whole if era == "v1" else unwrapped), 0
            if ref.name == "data":
                return unwrapped, 0
            return None

        return resolver

    def _statement_with_data(self, statement: Any, data: Any, kind: str, s: CommentedMap, key: str) -> Any:
        """A sink statement: `:name` binds and `{{ data.x }}` read the sink's data mapping."""
        if not isinstance(statement, str):
            raise _Refuse("a sink statement is not a string", s, key)
        if not isinstance(data, dict):
            return statement
        exprs: dict[str, str] = {}
        for k, v in data.items():
            e = single_expression(v) if isinstance(v, str) else None
            exprs[str(k)] = (
                e if e is not None else repr(_plain(v)) if not isinstance(v, str) else repr(str(v))
            )
        if "{{" not in statement:

            def bind(m: re.Match) -> str:
                name = m.group(1)
                if name not in exprs:
                    raise _Refuse(f"statement bind :{name} is not in the sink data", s, key)
                return "{{ " + exprs[name] + " }}"

            return _restyle(statement, re.sub(r"(?<![:\w]):([A-Za-z_]\w*)", bind, statement))

        def resolver(ref: NameRef) -> tuple[str, int] | None:
            if ref.name == "data" and ref.path and ref.path[0] in exprs:
                return _group(exprs[ref.path[0]]), 1
            return None

        return _restyle(statement, rewrite_template(statement, resolver))
