"""The fold of a v1 loop: the steps between a loop step and its ``end_loop`` step become the loop's
pipeline, routing inside the chain becomes policy rules, and references after the loop are rewritten."""

from __future__ import annotations

import copy
from typing import Any

from ruamel.yaml.comments import CommentedMap, CommentedSeq

from .base import MigratorBase
from .constants import RAW_TEXT_KEYS
from .pieces import _bind_main_params, _Group, _Target, _task_items, _TaskRef
from .report import _Refuse
from .templates import NameRef, Resolver, _tmpl, conjoin, rewrite_template, single_expression
from .yamltree import _cm, _flow, _pop, _put, _restyle


class LoopBodyMixin(MigratorBase):
    """Folds the chain between a v1 loop step and its end_loop step into the loop step."""

    def _collapse_into(self, L: CommentedMap, E: CommentedMap) -> None:
        lname, ename = L["step"], E["step"]
        entry_groups = self._legacy_groups(L)
        if not entry_groups or len(entry_groups) != 1 or entry_groups[0].kind != "always" \
                or len(entry_groups[0].targets) != 1:  # fmt: skip
            raise _Refuse("the loop step must route to exactly one first body step", L, "next")
        entry = entry_groups[0].targets[0]
        # the body: every step reachable from the entry without passing E
        body: list[str] = []
        routes: dict[str, list[_Group]] = {}
        todo = [entry.step]
        while todo:
            n = todo.pop()
            if n in body or n == ename:
                continue
            st = self.steps.get(n)
            if st is None:
                raise _Refuse(f"the loop body routes to missing step {n!r}", L, "next")
            if n == lname:
                raise _Refuse("the loop body routes back to the loop step", L, "next")
            for k in ("loop", "case", "sink", "save", "retry", "vars", "end_loop", "when"):
                if k in st:
                    raise _Refuse(f"body step {n!r} has `{k}`; nested constructs are not folded", st, k)
            body.append(n)
            groups = self._legacy_groups(st) or []
            routes[n] = groups
            for g in groups:
                todo.extend(t.step for t in g.targets)
        order = [n for n in self.steps if n in body]  # file order
        pos = {n: i for i, n in enumerate(order)}
        reachable = self._reachable_from_entry()
        outside_refs: set[str] = set()
        for n, st in self.steps.items():
            if n in body or n == lname:
                continue
            for g in self._legacy_groups(st, quiet=True) or []:
                for t in g.targets:
                    if t.step in body:
                        if n in reachable:
                            raise _Refuse(
                                f"step {n!r} outside the loop routes into its body step {t.step!r}", L, "next"
                            )
                        outside_refs.add(t.step)
        for n in order:
            kinds = [g.kind for g in routes[n]]
            if any(len(g.targets) != 1 for g in routes[n]) or kinds.count("always") > 1:
                raise _Refuse(
                    f"body step {n!r} fans out; a pipeline runs one task at a time", self.steps[n], "next"
                )
            if "always" in kinds and len(kinds) > 1:
                raise _Refuse(
                    f"body step {n!r} routes both always and on conditions (a fan-out)", self.steps[n], "next"
                )
            for g in routes[n]:
                if g.targets[0].step != ename and pos[g.targets[0].step] <= pos[n]:
                    raise _Refuse(f"body step {n!r} routes backwards; not folded", self.steps[n], "next")
        # tasks: one per body step (v1 tool conversion first), then the iteration result
        tasks: list[_TaskRef] = []
        for n in order:
            st = self.steps[n]
            self._v1_tool(st, ("workflow", self.doc["workflow"].index(st)))
            items = _task_items(st.get("tool"))
            if not items or len(items) != 1:
                raise _Refuse(f"body step {n!r} does not run exactly one task", st, "step")
            tb = items[0].body
            if isinstance(st.get("with"), dict) or isinstance(st.get("args"), dict):
                raise _Refuse(f"body step {n!r} has `with` without a task", st, "with")
            tb = copy.deepcopy(tb) if n in outside_refs else tb
            if isinstance(st.get("desc"), str) and "desc" not in tb:
                tb.insert(
                    1 if "kind" in tb else 0, "desc", st["desc"]
                )  # the step's description stays with its task
            tasks.append(_TaskRef(n, tb, "name"))
        collector = self._fresh_label(f"{lname}_iteration", tasks)
        names = set(order)

        def body_resolver(current: str | None, in_policy: bool) -> Resolver:
            def resolver(ref: NameRef) -> tuple[str, int] | None:
                if in_policy and ref.name == current:
                    return "outcome.result", 0
                if ref.name in names:
                    return f"results.{ref.name}", 0
                return None

            return resolver

        def rw(value: Any, resolver: Resolver) -> Any:
            if isinstance(value, str):
                return _restyle(value, rewrite_template(value, resolver))
            if isinstance(value, dict):
                for k in list(value.keys()):
                    if k not in RAW_TEXT_KEYS:
                        value[k] = rw(value[k], resolver)
                return value
            if isinstance(value, list):
                for i in range(len(value)):
                    value[i] = rw(value[i], resolver)
                return value
            return value

        # values routed in with `with` become iteration-scope writes (set_iter) of the rule that routes
        def set_iter_of(t: _Target, current: str | None) -> CommentedMap | None:
            if not isinstance(t.args, dict) or not t.args:
                return None
            out = CommentedMap()
            for k, v in t.args.items():
                out[k] = rw(copy.deepcopy(v), body_resolver(current, True))
            return out

        labels = [t.label for t in tasks] + [collector]
        first_writes = set_iter_of(entry, None)
        routed_in: dict[str, set[str]] = {entry.step: set(entry.args or {})}
        for n in order:
            for g in routes[n]:
                for tgt in g.targets:
                    routed_in.setdefault(tgt.step, set()).update(str(k) for k in (tgt.args or {}))
        for i, n in enumerate(order):
            _bind_main_params(tasks[i].body, routed_in.get(n, set()))
        for i, n in enumerate(order):
            t = tasks[i]
            rw(t.body, body_resolver(n, False))
            nxt_label = labels[i + 1]
            rules = CommentedSeq()

            def jump(target: str, writes: CommentedMap | None, nxt_label: str = nxt_label) -> CommentedMap:
                to = collector if target == ename else target
                then = CommentedMap()
                then["do"] = "continue" if to == nxt_label else "jump"
                if to != nxt_label:
                    then["to"] = to
                if writes:
                    then["set_iter"] = writes
                return then

            groups = routes[n]
            if not groups:  # a dead end ends the iteration
                rules.append(
                    _cm(("when", _tmpl("outcome.status == 'ok'")), ("then", _flow(jump(ename, None))))
                )
            elif groups[0].kind == "always":
                tgt = groups[0].targets[0]
                then = jump(tgt.step, set_iter_of(tgt, n))
                if then["do"] != "continue" or "set_iter" in then:
                    rules.append(_cm(("when", _tmpl("outcome.status == 'ok'")), ("then", then)))
            else:
                conds = [g for g in groups if g.kind == "cond"]
                default = [g for g in groups if g.kind == "default"]
                for g in conds:
                    expr = single_expression(g.when)
                    if expr is None:
                        raise _Refuse(
                            f"condition {g.when!r} is not one `{{{{ expression }}}}`", self.steps[n], "next"
                        )
                    pexpr = rewrite_template("{{ " + expr + " }}", body_resolver(n, True))[3:-3]
                    tgt = g.targets[0]
                    rules.append(_cm(("when", _tmpl(conjoin("outcome.status == 'ok'", pexpr))),
                                     ("then", jump(tgt.step, set_iter_of(tgt, n)))))  # fmt: skip
                tgt = default[0].targets[0] if default else None
                rules.append(_cm(("when", _tmpl("outcome.status == 'ok'")),
                                 ("then", jump(tgt.step if tgt else ename, set_iter_of(tgt, n) if tgt else None))))  # fmt: skip
            if rules:
                spec = t.body.setdefault("spec", CommentedMap())
                policy = spec.setdefault("policy", CommentedMap())
                if "rules" in policy:
                    raise _Refuse(f"body step {n!r} already has policy rules", self.steps[n], "tool")
                policy["rules"] = rules
        if first_writes:
            first = tasks[0].body
            inputs = CommentedMap()
            for k, v in first_writes.items():
                inputs[k] = v
            # the first body step read the loop's `with` values as names: bind them for the whole iteration
            tasks.insert(0, _TaskRef(self._fresh_label(f"{lname}_bind", tasks), _cm(
                ("kind", "noop"),
                ("spec", _cm(("policy", _cm(("rules", CommentedSeq([_cm(("else", _cm(("then", _cm(
                    ("do", "continue"), ("set_iter", inputs))))))]))))))), "name"))  # fmt: skip
            del first
        # the iteration's result: {body step: its result} (the v1 `<loop>_results` item)
        collect = CommentedMap()
        for n in order:
            collect[n] = _tmpl(f"results.{n} | default(none)")
        tasks.append(_TaskRef(collector, _cm(("kind", "noop"), ("result", collect)), "name"))
        # workbook calls cannot keep their label in a `{name: ...}` list item; label-map form keeps both
        L_tool = CommentedSeq()
        for t in tasks:
            body = t.body
            if body.get("kind") == "workbook":
                L_tool.append(_cm((t.label, body)))
            else:
                if "name" in body:
                    body.pop("name")
                body.insert(0, "name", t.label)
                L_tool.append(body)
        # E: its `result` becomes a task computing it; references to the loop body read the last iteration
        post = self._post_loop_resolver(lname, names)
        end_args = E.get("with")
        self._fold_end(E, lname, post)
        L_next = _cm(
            ("spec", _flow(_cm(mode="exclusive"))),
            ("arcs", CommentedSeq([self._arc(_Target(ename, end_args))])),
        )
        if "with" in E:
            _pop(E, "with")
        # write L
        self._replace_next(L, L_next)
        _put(L, "tool", L_tool, before="next")
        # the body steps are gone from the workflow, unless an unreachable step still routes to them
        wf = self.doc["workflow"]
        for n in order:
            if n not in outside_refs:
                wf.remove(self.steps[n])
                del self.steps[n]
        for st in wf:
            if isinstance(st, dict) and st is not L:
                for key in (
                    "next",
                    "tool",
                    "set",
                    "vars",
                    "case",
                    "sink",
                    "save",
                    "result",
                    "with",
                    "args",
                    "input",
                ):
                    if key in st and st is not E:
                        st[key] = rw(st[key], post)
        self.note("info", "end-loop", f"steps {order} became the pipeline of loop step {lname!r}; {ename!r} runs "
                  "once after the loop", L, "loop", ("workflow", wf.index(L), "loop"))  # fmt: skip
        for n in sorted(outside_refs):
            self.note("warning", "end-loop", f"step {n!r} is also kept as a step: a step unreachable from the entry "
                      "routes to it", self.steps[n], "step")  # fmt: skip
