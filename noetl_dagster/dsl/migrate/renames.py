"""NoETL's renamed keys, old spelling -> new (issue 17.1): step/task ``args`` -> ``input``, arc
``args`` -> ``set: {step.*}`` (issue 32.5),
``set_ctx`` / ``set_iter`` -> ``set: {ctx.*, iter.*}``, ``outcome`` -> ``output`` in policy rules,
arcs and step ``set``, tool ``output.store.kind: object`` -> ``disk``. Runs last, so the spellings the other rules produce are rewritten too; the
places are exactly those ``dsl.legacy.find_deprecated_spellings`` reports (validate's warnings)."""

from __future__ import annotations

from typing import Any

from ruamel.yaml.comments import CommentedMap

from noetl_dagster.dsl.legacy import _OUTCOME_REF, _TEMPLATE, ARC_ARGS, OBJECT_TIER, find_deprecated_spellings

from .base import MigratorBase
from .yamltree import _index, _rename_key, _restyle


def _rewrite_outcome(text: str) -> str:
    return _TEMPLATE.sub(lambda m: _OUTCOME_REF.sub("output", m.group(0)), text)


class RenameMixin(MigratorBase):
    def _renames(self) -> None:
        found = find_deprecated_spellings(self.doc)
        # templates first: the key renames below move the values they sit under
        for path, old, _new in found:
            if old == "template variable `outcome`":
                parent = self._at(path[:-1])
                if isinstance(parent, (dict, list)):
                    value = parent[path[-1]]
                    if isinstance(value, str):
                        parent[path[-1]] = _restyle(value, _rewrite_outcome(value))
        for path, old, _new in reversed(found):  # deepest last-first keeps earlier paths valid
            holder = self._at(path[:-1])
            key = path[-1]
            if not isinstance(holder, CommentedMap) or key not in holder:
                continue
            if old == OBJECT_TIER:
                holder[key] = _restyle(holder[key], "disk")
                self.note("info", "renamed-key", "output store kind `object` -> `disk`", holder, key, path)
            elif old == ARC_ARGS:
                self._merge_set(holder, key, path)
            elif key == "args":
                if "input" in holder:
                    self.note(
                        "refused",
                        "renamed-key",
                        "both `input` and `args`; left as written",
                        holder,
                        key,
                        path,
                    )
                    continue
                _rename_key(holder, "args", "input")
                self.note("info", "renamed-key", "`args` -> `input`", holder, "input", path)
            elif key in ("set_ctx", "set_iter"):
                self._merge_set(holder, key, path)

    def _merge_set(self, holder: CommentedMap, key: str, path: tuple) -> None:
        ns = {"set_ctx": "ctx", "set_iter": "iter", "args": "step"}[key]
        writes = holder[key]
        if not isinstance(writes, dict):
            self.note(
                "refused", "renamed-key", f"`{key}` is not a mapping; left as written", holder, key, path
            )
            return
        target = holder.get("set")
        if target is not None and not isinstance(target, dict):
            self.note(
                "refused",
                "renamed-key",
                f"`set` is not a mapping; `{key}` left as written",
                holder,
                key,
                path,
            )
            return
        clash = [k for k in writes if isinstance(target, dict) and f"{ns}.{k}" in target]
        if clash:
            self.note("refused", "renamed-key", f"`set` already writes {ns}.{clash[0]}; `{key}` left as written",
                      holder, key, path)  # fmt: skip
            return
        if target is None:
            new = CommentedMap()
            if getattr(writes, "fa", None) is not None and writes.fa.flow_style():
                new.fa.set_flow_style()
            for k, v in writes.items():
                new[f"{ns}.{k}"] = v
                if k in writes.ca.items:  # a trailing comment or blank line stays with its key
                    new.ca.items[f"{ns}.{k}"] = writes.ca.items[k]
            pos = _index(holder, key)
            holder.pop(key)
            holder.insert(pos, "set", new)
        else:
            for k, v in writes.items():
                target[f"{ns}.{k}"] = v
            holder.pop(key)
        self.note("info", "renamed-key", f"`{key}` -> `set: {{{ns}.*}}`", holder, "set", path)

    def _at(self, path: tuple) -> Any:
        node: Any = self.doc
        for part in path:
            try:
                node = node[part]
            except (KeyError, IndexError, TypeError):
                return None
        return node
