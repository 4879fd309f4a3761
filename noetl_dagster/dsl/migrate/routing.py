"""Routing: legacy ``next`` lists and names (v1 ``{when, then}`` / ``{else}`` rules, ``{step, with}``
targets) -> ``next: {spec: {mode}, arcs}``, with the failure guard on arcs of tool steps."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from ruamel.yaml.comments import CommentedMap, CommentedSeq

from .base import MigratorBase
from .constants import ARG_KEYS
from .pieces import _Group, _Target, _target_args
from .report import _Refuse
from .templates import _group, _group_always, _tmpl, conjoin, single_expression
from .yamltree import _cm, _dq, _flow, _index, _line


class RoutingMixin(MigratorBase):
    """Rules that turn a legacy ``next`` into a router (exclusive or inclusive arcs)."""

    # -- routing -----------------------------------------------------------------
    def _legacy_groups(self, s: CommentedMap, quiet: bool = False) -> list[_Group] | None:
        """A legacy `next` (list or name) as routing groups; None when there is none or it is a router."""
        if quiet:
            try:
                return self._legacy_groups(s)
            except _Refuse:
                return None
        nxt = s.get("next")
        if isinstance(nxt, str):
            return [_Group("always", [_Target(nxt)], line=_line(s, "next"))]
        if not isinstance(nxt, list):
            return None
        groups: list[_Group] = []
        for i, item in enumerate(nxt):
            line = _line(nxt, i)
            if isinstance(item, str):
                groups.append(_Group("always", [_Target(item)], line=line))
            elif isinstance(item, dict) and "then" in item and ("when" in item or "condition" in item):
                when = item.get("when", item.get("condition"))
                groups.append(_Group("cond", self._targets(item["then"]), when=when, line=line))
                if "else" in item:
                    if any(isinstance(x, dict) and "when" in x for x in nxt[i + 1 :]):
                        raise _Refuse("a `when` with its own `else` is followed by more conditions", nxt, i)
                    groups.append(_Group("default", self._targets(item["else"]), line=line))
            elif isinstance(item, dict) and "else" in item and "step" not in item:
                groups.append(_Group("default", self._targets(item["else"]), line=line))
            elif isinstance(item, dict) and isinstance(item.get("step"), str):
                args = _target_args(item, nxt, i)
                extra = [k for k in item if k not in ("step", *ARG_KEYS, "when", "condition", "set", "desc")]
                if extra:
                    raise _Refuse(f"next item keys {extra} have no counterpart", nxt, i)
                tgt = _Target(item["step"], args, item)
                if "when" in item or "condition" in item:
                    when = item.get("when", item.get("condition"))
                    groups.append(_Group("cond", [tgt], when=when, set=item.get("set"), line=line))
                else:
                    groups.append(_Group("always", [tgt], set=item.get("set"), line=line))
            else:
                raise _Refuse("a `next` item is neither a step, a `{when, then}` nor an `{else}`", nxt, i)
        return groups

    @staticmethod
    def _targets(raw: Any) -> list[_Target]:
        items = raw if isinstance(raw, list) else [raw]
        out = []
        for t in items:
            if isinstance(t, str):
                out.append(_Target(t))
            elif isinstance(t, dict) and isinstance(t.get("step"), str):
                extra = [k for k in t if k not in ("step", *ARG_KEYS)]
                if extra:
                    raise _Refuse(f"target keys {extra} have no counterpart", t)
                out.append(_Target(t["step"], _target_args(t, t, None), t))
            else:
                raise _Refuse("a routing target is not a step name or `{step, with}`", t)
        return out

    def _guard(self, s: CommentedMap) -> str | None:
        """Legacy routing never left a failed step, while a standard arc (with or without `when`) also
        routes a failure (SEMANTICS §5): migrated arcs keep the legacy rule with this guard (loop steps excepted)."""
        if "loop" in s or "tool" not in s:
            return None
        return "event.name != 'call.error'"

    def _arc(self, t: _Target, when: str | None = None, set_: Any = None) -> CommentedMap:
        arc = CommentedMap()
        arc["step"] = t.step
        if when is not None:
            arc["when"] = _tmpl(when) if not str(when).startswith("{{") else _dq(when)
        if t.args is not None:
            arc["args"] = t.args
        if set_ is not None:
            arc["set"] = set_
        return arc

    def _router(
        self, groups: list[_Group], guard: str | None, cond_expr: Callable[[Any], str]
    ) -> CommentedMap:
        """Routing groups (first matching `cond` fires; `default` if none did; `always` always) -> a router."""
        conds = [g for g in groups if g.kind == "cond"]
        default = [t for g in groups if g.kind == "default" for t in g.targets]
        always = [g for g in groups if g.kind == "always"]
        arcs = CommentedSeq()

        def when_of(raw: Any, extra: list[str]) -> str:
            expr = cond_expr(raw)
            mentions_event = re.search(r"(?<![\w.])(event|outcome|error)\b", expr) is not None
            return conjoin(None if mentions_event else guard, *extra, expr)

        if not conds:
            targets = [(t, g.set) for g in always for t in g.targets] + [(t, None) for t in default]
            mode = "exclusive" if len(targets) <= 1 else "inclusive"
            for t, st in targets:
                arcs.append(self._arc(t, guard, st))
        elif not always and all(len(g.targets) == 1 for g in conds) and len(default) <= 1:
            mode = "exclusive"
            for g in conds:
                arcs.append(self._arc(g.targets[0], when_of(g.when, []), g.set))
            for t in default:
                arcs.append(self._arc(t, guard))
        else:
            mode = "inclusive"
            exprs = [cond_expr(g.when) for g in conds]
            for g in always:
                for t in g.targets:
                    arcs.append(self._arc(t, guard, g.set))
            for i, g in enumerate(conds):
                earlier = [f"not {_group_always(e)}" for e in exprs[:i]]
                for t in g.targets:
                    arcs.append(self._arc(t, when_of(g.when, earlier), g.set))
            if default:
                none_matched = "not (" + " or ".join(_group(e) for e in exprs) + ")"
                for t in default:
                    arcs.append(self._arc(t, conjoin(guard, none_matched)))
        return _cm(("spec", _flow(_cm(mode=mode))), ("arcs", arcs))

    def _cond_expr_plain(self, raw: Any) -> str:
        expr = single_expression(raw)
        if expr is None:
            if isinstance(raw, bool):
                return "true" if raw else "false"
            raise _Refuse(f"condition {raw!r} is not one `{{{{ expression }}}}`")
        return expr

    def _next(self, s: CommentedMap, path: tuple) -> None:
        try:
            groups = self._legacy_groups(s)
            assert groups is not None
            router = self._router(groups, self._guard(s), self._cond_expr_plain)
            self._replace_next(s, router)
        except _Refuse as e:
            self.refuse(e, "next", s, "next", (*path, "next"))

    @staticmethod
    def _replace_next(s: CommentedMap, router: CommentedMap) -> None:
        comment = s.ca.items.get("next")
        pos = _index(s, "next")
        s.pop("next")
        s.insert(pos, "next", router)
        if comment is not None:
            s.ca.items["next"] = comment
