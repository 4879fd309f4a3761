"""Root-level rules (v1 ``apiVersion`` / ``name`` / ``path`` -> ``metadata``, ``workbooks`` entries,
root ``vars`` -> ``workload``) and the template rewrites valid in every context (``vars.x``, v1
task-name results, ``<loop>_results``, legacy postgres ``command_<i>`` results, v1 workbook inputs)."""

from __future__ import annotations

from typing import Any

from ruamel.yaml.comments import CommentedMap

from .base import MigratorBase
from .constants import _COMMAND_N, KIND_ALIASES, OLD_APIS, RAW_TEXT_KEYS, STANDARD_API
from .pieces import _task_items
from .sql import _count_statements
from .templates import NameRef, TemplateRewriteError, _rewrite_all, rewrite_template
from .yamltree import _index, _line, _pop, _rename_key, _restyle, _walk_strings


class RootMixin(MigratorBase):
    """Rules over the document root and the file-wide template rewrites."""

    # -- root ------------------------------------------------------------------
    def _root(self) -> None:
        d = self.doc
        api = d.get("apiVersion")
        self.v1 = api in OLD_APIS or (api is None and "name" in d and "metadata" not in d)
        if api in OLD_APIS:
            d["apiVersion"] = _restyle(api, STANDARD_API)
        elif api is None:
            d.insert(0, "apiVersion", STANDARD_API)
        if not isinstance(d.get("metadata"), dict) and any(k in d for k in ("name", "path")):
            meta = CommentedMap()
            keys = [k for k in ("name", "path", "description", "version") if k in d]
            pos = min(_index(d, k) for k in keys)
            for k in keys:
                _pop(d, k, meta)
            d.insert(pos, "metadata", meta)
        if "workbooks" in d:
            if "workbook" in d:
                self.note("refused", "workbooks", "both `workbook` and `workbooks` exist; merge them by hand", d,
                          "workbooks", ("workbooks",))  # fmt: skip
            else:
                _rename_key(d, "workbooks", "workbook")
        wb = d.get("workbook")
        if isinstance(wb, list):
            for i, entry in enumerate(wb):
                if isinstance(entry, dict):
                    self._workbook_entry(entry, ("workbook", i))

    def _workbook_entry(self, e: CommentedMap, path: tuple) -> None:
        if "tool" not in e and ("type" in e or "kind" in e):
            self.v1_entries = getattr(self, "v1_entries", []) + [e]
            tool = CommentedMap()
            kind = e.get("kind", e.get("type"))
            tool["kind"] = KIND_ALIASES.get(str(kind), kind)
            pos = _index(e, "kind" if "kind" in e else "type")
            for k in list(e.keys()):
                if k in ("name", "desc", "assert", "type", "kind"):
                    continue
                _pop(e, k, tool)
            e.pop("type", None)
            e.pop("kind", None)
            e.insert(min(pos, len(e)), "tool", tool)
            if "assert" in e:  # keep `assert` after the tool it checks
                _pop(e, "assert", e)
        if isinstance(e.get("tool"), dict):
            self._task_body(e["tool"], (*path, "tool"), None)

    # -- template references valid in every context ------------------------------
    def _global_templates(self) -> None:
        loops = {n for n, s in self.steps.items() if isinstance(s.get("loop"), dict)}
        callers = {
            t: steps[0]
            for t, steps in self.task_callers.items()
            if len(steps) == 1 and t not in self.steps and t not in self.workload_keys
        }
        for t, steps in self.task_callers.items():
            if len(steps) > 1 and t not in self.steps:
                self.ambiguous_tasks = getattr(self, "ambiguous_tasks", set()) | {t}

        def resolver(ref: NameRef) -> tuple[str, int] | None:
            if ref.name == "vars" and ref.path:
                return self._vars_read(ref.path[0]), 1
            if ref.name in callers:
                return callers[ref.name], 0
            if (
                ref.name.endswith("_results")
                and ref.name[: -len("_results")] in loops
                and ref.name not in self.steps
            ):
                return f"{ref.name[: -len('_results')]}.results", 0
            return None

        def fn(text: str, path: tuple) -> str | None:
            try:
                return rewrite_template(text, resolver)
            except TemplateRewriteError as e:
                self.note("warning", "template", f"{e}; its references were not rewritten", path=path,
                          line=self._line_at(path))  # fmt: skip
                return None

        for key in ("workload", "workbook", "workflow", "executor", "keychain", "vars"):
            if key in self.doc:
                _walk_strings(self.doc[key], fn, (key,))

    def _vars_read(self, name: str) -> str:
        in_root, written = name in self.root_vars, name in self.written_vars
        if in_root and written:
            return f"(ctx.{name} | default(workload.{name}))"
        if in_root:
            return f"workload.{name}"
        return f"ctx.{name}"

    def _line_at(self, path: tuple) -> int:
        node: Any = self.doc
        line = 1
        for p in path:
            try:
                line = _line(node, p, line)
                node = node[p]
            except (KeyError, IndexError, TypeError):
                break
        return line

    # -- v1 workbook tasks read their `with` values by name ------------------------------
    def _v1_workbook_inputs(self) -> None:
        """A v1 workbook task rendered with the caller's `with` values as names; in the standard form a
        workbook call's merged input is ``args``: ``{{ x }}`` becomes ``{{ args.x }}`` for those names."""
        entries = getattr(self, "v1_entries", [])
        if not entries:
            return
        passed: dict[str, set[str]] = {}
        for st in self.doc.get("workflow") or []:
            if not isinstance(st, dict):
                continue
            for t in _task_items(st.get("tool")) or []:
                if t.body.get("kind") == "workbook" and isinstance(t.body.get("name"), str):
                    keys = set(t.body["input"]) if isinstance(t.body.get("input"), dict) else set()
                    if isinstance(st.get("input"), dict):
                        keys |= set(st["input"])
                    passed.setdefault(t.body["name"], set()).update(str(k) for k in keys)
        reserved = {
            "workload",
            "ctx",
            "iter",
            "args",
            "keychain",
            "execution_id",
            "steps",
            "results",
            "input",
        }
        for e in entries:
            tool = e.get("tool")
            if not isinstance(tool, dict) or tool.get("kind") == "python":
                continue
            names = set(passed.get(str(e.get("name")), set()))
            if isinstance(tool.get("input"), dict):
                names |= {str(k) for k in tool["input"]}
            names -= reserved
            if not names:
                continue

            def resolver(ref: NameRef, _names: set[str] = names) -> tuple[str, int] | None:
                return (f"args.{ref.name}", 0) if ref.name in _names else None

            for k in list(tool.keys()):
                if k in ("input", "kind") or k in RAW_TEXT_KEYS:
                    continue
                try:
                    tool[k] = _rewrite_all(tool[k], resolver)
                except TemplateRewriteError as err:
                    self.note("warning", "workbook-input", f"{err}; names not rewritten", tool, k)

    # -- legacy postgres results (one `command_<i>` entry per statement) --------------
    def _legacy_pg_results(self) -> None:
        """Early-era postgres results were keyed by statement (``command_0``...); the standard result is the
        last statement's ``{rows, row_count, columns}``. In a file that still addresses ``command_<i>``,
        ``X.command_<last>`` reads become ``X`` and whole-result reads ``{'command_<last>': X}``."""
        if not _COMMAND_N.search(self._text_of(self.doc)):
            return
        pg: dict[str, int] = {}
        for name, st in self.steps.items():
            items = _task_items(st.get("tool"))
            if items and len(items) == 1 and items[0].body.get("kind") == "postgres":
                sql = items[0].body.get("command", items[0].body.get("query"))
                if isinstance(sql, str):
                    pg[name] = max(_count_statements(sql) - 1, 0)
        if not pg:
            return
        wrapped: set[str] = set()

        def resolver(ref: NameRef) -> tuple[str, int] | None:
            last = pg.get(ref.name)
            if last is None:
                return None
            if ref.path and _COMMAND_N.fullmatch(ref.path[0]):
                if int(ref.path[0].split("_")[1]) == last:
                    return ref.name, 1
                return None
            if not ref.path:
                wrapped.add(ref.name)
                return f"{{'command_{last}': {ref.name}}}", 0
            return None

        def fn(text: str, path: tuple) -> str | None:
            try:
                return rewrite_template(text, resolver)
            except TemplateRewriteError:
                return None

        for key in ("workflow", "workbook"):
            if key in self.doc:
                _walk_strings(self.doc[key], fn, (key,))
        if wrapped:
            self.note("warning", "postgres-result", f"whole results of postgres steps {sorted(wrapped)} keep the "
                      "legacy `{'command_<i>': ...}` shape because the file reads `command_<i>`; the standard "
                      "result is the last statement's {rows, row_count, columns}", self.doc, "workflow",
                      ("workflow",))  # fmt: skip

    @staticmethod
    def _text_of(node: Any) -> str:
        parts: list[str] = []

        def collect(n: Any) -> None:
            if isinstance(n, dict):
                for v in n.values():
                    collect(v)
            elif isinstance(n, list):
                for v in n:
                    collect(v)
            elif isinstance(n, str):
                parts.append(n)

        collect(node)
        return "\n".join(parts)

    # -- root vars -> workload -----------------------------------------------------
    def _root_vars(self) -> None:
        d = self.doc
        if "vars" not in d:
            return
        v = d["vars"]
        if not isinstance(v, dict):
            self.note("refused", "root-vars", "root `vars` is not a mapping", d, "vars", ("vars",))
            return
        wl = d.get("workload")
        clash = sorted(set(v) & set(wl)) if isinstance(wl, dict) else []
        if clash:
            self.note("refused", "root-vars", f"root vars {clash} also exist in `workload`; rename one", d, "vars",
                      ("vars",))  # fmt: skip
            return
        if not isinstance(wl, dict):
            _rename_key(d, "vars", "workload")
        else:
            for k in list(v.keys()):
                _pop(v, k, wl)
            _pop(d, "vars")
        self.note("info", "root-vars", "root `vars` became `workload` defaults; writes to them go to `ctx`",
                  d, "workload", ("workload",))  # fmt: skip
