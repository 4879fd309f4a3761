"""Early-v2 ``case``: each rule is split into arcs (``next``) and task policy rules / storage tasks
(``sink``, ``log``, ``retry``, ``fail``, ``set``), conditions re-read for routing or for the outcome."""

from __future__ import annotations

from typing import Any

from ruamel.yaml.comments import CommentedMap
from ruamel.yaml.scalarstring import LiteralScalarString

from .base import MigratorBase
from .pieces import _Group, _raise, _TaskRef
from .report import _Refuse
from .templates import (
    NameRef,
    TemplateRewriteError,
    _tmpl,
    rewrite_event_names,
    rewrite_template,
    single_expression,
)
from .yamltree import _cm, _dq, _flow, _index, _line, _pop, _restyle


class CaseMixin(MigratorBase):
    """Rules that split an early-v2 ``case`` into arcs and pipeline policy rules."""

    # -- case ----------------------------------------------------------------------
    def _case(self, s: CommentedMap, path: tuple) -> None:
        """`case` rules -> arcs (their `next`), task policy rules (retry, fail, set) and storage tasks (sink, log)."""
        name = s["step"]
        is_loop = isinstance(s.get("loop"), dict)
        try:
            rules = s["case"]
            if not isinstance(rules, list):
                raise _Refuse("`case` is not a list", s, "case")
            arc_groups: list[_Group] = []
            pipe: list[tuple[str, dict[str, Any], Any]] = []  # (policy condition, actions, rule node)
            for i, rule in enumerate(rules):
                if not isinstance(rule, dict) or "when" not in rule or "then" not in rule:
                    raise _Refuse("a case rule is not `{when, then}`", rules, i)
                cond = single_expression(rule["when"])
                if cond is None:
                    raise _Refuse(
                        f"case condition {rule['when']!r} is not one `{{{{ expression }}}}`", rules, i
                    )
                actions = self._case_actions(rule["then"], rules, i)
                unknown = sorted(set(actions) - {"next", "sink", "retry", "set", "vars", "log", "fail"})
                if unknown:
                    raise _Refuse(f"case actions {unknown} have no standard counterpart", rules, i)
                if "next" in actions:
                    set_ = self._ctx_set(actions.get("set") or actions.get("vars"))
                    arc_cond = self._arc_expr(cond, name, is_loop)
                    arc_groups.append(_Group("cond", self._targets(actions["next"]), when=_tmpl(arc_cond), set=set_,
                                             line=_line(rules, i)))  # fmt: skip
                pipe_actions = {k: v for k, v in actions.items() if k in ("sink", "retry", "log", "fail")}
                if not pipe_actions and ("set" in actions or "vars" in actions) and "next" not in actions:
                    pipe_actions["set"] = actions.get("set") or actions.get("vars")
                if pipe_actions:
                    pipe.append((cond, pipe_actions, rules[i]))
            tasks = None
            if pipe:
                tasks = self._case_pipeline(s, pipe)
            structural = self._legacy_groups(s) if isinstance(s.get("next"), (list, str)) else None
            if isinstance(s.get("next"), dict):
                if arc_groups:
                    raise _Refuse("`case` routing next to a `next` router", s, "case")
                structural = None
            groups = arc_groups + [_Group("default", g.targets, set=g.set) if g.kind == "always" else g
                                   for g in (structural or [])]  # fmt: skip
            router = self._router(groups, None, self._cond_expr_plain) if groups else None
        except _Refuse as e:
            self.refuse(e, "case", s, "case", (*path, "case"))
            return
        except TemplateRewriteError as e:
            self.refuse(_Refuse(str(e)), "case", s, "case", (*path, "case"))
            return
        if tasks is not None:
            self._set_pipeline(s, tasks)
        if router is not None:
            if "next" in s:
                self._replace_next(s, router)
            else:
                s.insert(_index(s, "case"), "next", router)
        _pop(s, "case")

    @staticmethod
    def _case_actions(then: Any, node: Any, key: Any) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if isinstance(then, dict):
            out = dict(then)
        elif isinstance(then, list):
            targets = [a for a in then if isinstance(a, dict) and isinstance(a.get("step"), str)]
            if targets:  # `then: [- step: x]`: targets written directly
                out["next"] = targets
            for a in then:
                if a in targets:
                    continue
                if not isinstance(a, dict):
                    raise _Refuse("a case action is not a mapping", node, key)
                for k, v in a.items():
                    if k in out:
                        raise _Refuse(f"case action {k!r} appears twice in one rule", node, key)
                    out[k] = v
        else:
            raise _Refuse("case `then` is not a mapping", node, key)
        res = out.get("result")
        if isinstance(res, dict) and set(res) == {"from"} and res["from"] in ("response", "result"):
            del out["result"]  # the step's result is its tool's response already
        return out

    def _ctx_set(self, raw: Any) -> CommentedMap | None:
        if raw is None:
            return None
        if isinstance(raw, list) and all(isinstance(x, dict) and set(x) == {"name", "value"} for x in raw):
            raw = {x["name"]: x["value"] for x in raw}  # the `[{name, value}]` spelling
        if not isinstance(raw, dict):
            raise _Refuse("a case `set` is not a mapping")
        out = CommentedMap()
        for k, v in raw.items():
            key = str(k) if str(k).startswith(("ctx.", "iter.")) else f"ctx.{k}"
            out[key] = v
        return out

    def _arc_expr(self, cond: str, step_name: str, is_loop: bool) -> str:
        """A case condition evaluated by routing: event names mapped, response/result -> the step's result."""

        def events(n: str) -> Any:
            if is_loop:
                if n == "loop.done":
                    return ["loop.done"]
                raise _Refuse(
                    f"a loop step's case routes on {n!r} per iteration; arcs run once, after the loop"
                )
            return {"call.done": ["call.done"], "call.error": ["call.error"], "step.exit": ["call.done", "call.error"],
                    "loop.done": ["loop.done"]}.get(n) or _raise(_Refuse(f"event {n!r} has no routing counterpart"))  # fmt: skip

        def resolver(ref: NameRef) -> tuple[str, int] | None:
            if ref.name in ("response", "result", "this"):
                return step_name, 0
            if ref.name == "error":
                return "outcome.error", 0
            return None

        expr = rewrite_event_names(cond, events)
        return rewrite_template("{{ " + expr + " }}", resolver)[3:-3]

    def _case_pipeline(self, s: CommentedMap, pipe: list[tuple[str, dict[str, Any], Any]]) -> list[_TaskRef]:
        tasks, main = self._main_task(s)
        kind = str(main.body.get("kind"))
        name = s["step"]
        rules: list[CommentedMap] = []
        chains: list[list[_TaskRef]] = []
        for cond, actions, node in pipe:
            pcond = self._policy_expr(cond, kind, name)
            then = CommentedMap()
            chain: list[_TaskRef] = []
            if "retry" in actions:
                if set(actions) - {"retry"}:
                    raise _Refuse("a case rule that retries and also stores or logs", node)
                r = actions["retry"]
                if not isinstance(r, dict):
                    raise _Refuse("case `retry` is not a mapping", node)
                if set(r) & {"params", "url", "method", "headers", "body", "data", "json"}:
                    raise _Refuse(
                        "pagination retries (new request parameters) are not translated; use a jump rule",
                        node,
                    )
                retry_rule = self._retry_rule(
                    {k: v for k, v in r.items() if k not in ("when", "retry_when")}, kind, name
                )
                retry_then = retry_rule["then"]
                rules.append(_cm(("when", _tmpl(pcond)), ("then", retry_then)))
                continue
            if "sink" in actions:
                sinks = actions["sink"] if isinstance(actions["sink"], list) else [actions["sink"]]
                for sk in sinks:
                    built = self._storage_task(sk, main, "v2", s, "case")
                    if built is not None:
                        label = self._fresh_label(
                            f"{name}_sink", tasks + [t for c in chains for t in c] + chain
                        )
                        chain.append(_TaskRef(label, built, "name"))
            if "log" in actions:
                label = self._fresh_label(f"{name}_log", tasks + [t for c in chains for t in c] + chain)
                msg = actions["log"]
                if isinstance(msg, str):
                    msg = _restyle(msg, rewrite_template(msg, self._sink_resolver(main.label, kind, "v2")))
                chain.append(_TaskRef(label, _cm(("kind", "python"), ("input", _cm(("message", _dq(msg)))),
                                                 ("code", LiteralScalarString("print(message)\nresult = {'logged': message}\n"))), "name"))  # fmt: skip
            if "set" in actions:
                set_ = self._ctx_set(actions["set"])
                assert set_ is not None
                then["set_ctx"] = CommentedMap(
                    (k[4:] if k.startswith("ctx.") else k, v) for k, v in set_.items()
                )
            if chain:
                then.insert(0, "do", "jump")
                then.insert(1, "to", chain[0].label)
                chains.append(chain)
            elif "fail" in actions:
                then.insert(0, "do", "fail")
            else:
                status = (
                    "ok"
                    if "outcome.status == 'ok'" in pcond
                    else "error"
                    if "outcome.status == 'error'" in pcond
                    else None
                )
                if status is None:
                    raise _Refuse(
                        "a case rule that only sets values must test the outcome (call.done / call.error)",
                        node,
                    )
                then.insert(0, "do", "continue" if status == "ok" else "fail")
            rules.append(_cm(("when", _tmpl(pcond)), ("then", _flow(then) if len(then) <= 2 else then)))
        if chains:
            rules.append(_cm(("when", _tmpl("outcome.status == 'ok'")), ("then", _flow(_cm(do="break")))))
        self._add_rules(main.body, rules, s, "case")
        for chain in chains:
            tasks.extend(chain)
        passthrough_before = len(tasks)
        self._add_passthrough(s, tasks, main)
        end_label = tasks[passthrough_before].label if len(tasks) > passthrough_before else None
        # the last task of each chain ends the pipeline (or goes to the passthrough), failures included:
        # the legacy worker logged a failed sink and carried on
        for chain in chains:
            last = chain[-1]
            is_final = tasks[-1] is last
            if end_label:
                then = _flow(_cm(do="jump", to=end_label))
            else:
                then = _flow(_cm(do="continue" if is_final else "break"))
            self._add_rules(last.body, [_cm(("else", _cm(("then", then))))], s, "case")
            for t in chain[:-1]:
                self._add_rules(t.body, [_cm(("when", _tmpl("outcome.status == 'error'")),
                                              ("then", _flow(_cm(do="jump", to=last.label))))], s, "case")  # fmt: skip
        return tasks
