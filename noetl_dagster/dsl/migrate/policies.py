"""Policies: ``eval`` rules -> ``spec.policy.rules``, ``retry:`` blocks -> ``do: retry`` rules, conditions
read against the outcome, and step ``vars`` -> step ``set: {ctx.*}``."""

from __future__ import annotations

from typing import Any

from ruamel.yaml.comments import CommentedMap, CommentedSeq

from .base import MigratorBase
from .constants import BACKOFFS
from .pieces import _task_items
from .report import _Refuse
from .templates import (
    NameRef,
    Resolver,
    TemplateRewriteError,
    _group,
    _tmpl,
    rewrite_event_names,
    rewrite_template,
    single_expression,
)
from .yamltree import _cm, _dq, _flow, _index, _pop, _restyle


class PolicyMixin(MigratorBase):
    """Rules that become task policy rules (eval, retry) and step ``set`` (vars)."""

    def _eval_rules(self, raw: Any, body: CommentedMap) -> list[CommentedMap]:
        """The v10-era ``eval: [{expr, do, ...}, {else: {do, set_vars}}]`` -> policy rules."""
        if not isinstance(raw, list):
            raise _Refuse("`eval` is not a list of rules", body, "eval")
        out = []
        for r in raw:
            if not isinstance(r, dict):
                raise _Refuse("an `eval` rule is not a mapping", body, "eval")
            if "else" in r:
                then = self._eval_then(r["else"] if isinstance(r["else"], dict) else {"do": r["else"]}, body)
                out.append(_cm(("else", _cm(("then", then)))))
            else:
                cond = r.get("expr", r.get("when"))
                if cond is None:
                    raise _Refuse("an `eval` rule has no `expr`", body, "eval")
                out.append(_cm(("when", _dq(cond)), ("then", self._eval_then(r, body))))
        return out

    def _eval_then(self, r: dict, body: CommentedMap) -> CommentedMap:
        then = CommentedMap()
        for k, v in r.items():
            if k in ("expr", "when"):
                continue
            if k == "set_vars":
                then["set_ctx"] = v
            elif k in ("do", "attempts", "backoff", "delay", "to", "set_ctx", "set_iter", "set"):
                then[k] = v
            else:
                raise _Refuse(f"`eval` key {k!r} has no counterpart", body, "eval")
        then.setdefault("do", "continue")
        return then

    def _add_rules(self, body: CommentedMap, rules: list[CommentedMap], node: Any, key: Any) -> None:
        """Put ``rules`` in front of the task's policy rules (an existing `else` stays last)."""
        spec = body.get("spec")
        if spec is None:
            spec = CommentedMap()
            body["spec"] = spec
        if not isinstance(spec, dict):
            raise _Refuse("the task `spec` is not a mapping", node, key)
        policy = spec.setdefault("policy", CommentedMap())
        if not isinstance(policy, dict):
            raise _Refuse("the task policy is not a mapping", node, key)
        existing = policy.get("rules")
        if existing is None:
            policy["rules"] = CommentedSeq(rules)
            return
        if not isinstance(existing, list):
            raise _Refuse("the task policy `rules` is not a list", node, key)
        if any(isinstance(r, dict) and "else" in r for r in rules) and any(
            isinstance(r, dict) and "else" in r for r in existing
        ):
            raise _Refuse("both the legacy block and the task policy define an `else` rule", node, key)
        for i, r in enumerate(rules):
            existing.insert(i, r)

    # retry blocks -> a `do: retry` rule
    def _retry_rule(self, retry: dict, kind: str, step_name: str | None) -> CommentedMap:
        then = CommentedMap()
        then["do"] = "retry"
        known = {"max_attempts", "attempts", "initial_delay", "delay", "backoff", "backoff_multiplier", "when",
                 "retry_when", "retry_on", "backoff_seconds", "retry_on_status"}  # fmt: skip
        extra = sorted(set(retry) - known)
        if extra:
            raise _Refuse(f"retry keys {extra} have no counterpart in task policy rules", retry, extra[0])
        # the legacy defaults: 3 attempts, 1 s doubling (backoff_multiplier 2.0)
        then["attempts"] = retry.get("max_attempts", retry.get("attempts", 3))
        backoff = retry.get("backoff")
        delay = retry.get("initial_delay", retry.get("delay", retry.get("backoff_seconds")))
        mult = retry.get("backoff_multiplier")
        if "backoff_seconds" in retry and backoff is None and mult is None:
            backoff = "fixed"  # a constant wait between attempts
        if isinstance(backoff, dict):
            extra = sorted(set(backoff) - {"type", "base_seconds", "delay"})
            if extra:
                raise _Refuse(f"backoff keys {extra} (caps) have no counterpart", retry, "backoff")
            delay = backoff.get("base_seconds", backoff.get("delay", delay))
            backoff = backoff.get("type")
        elif isinstance(backoff, (int, float)) and not isinstance(backoff, bool):
            delay, backoff = backoff, "fixed"
        if mult is not None:
            if float(mult) == 1.0:
                backoff = backoff or "fixed"
            elif float(mult) == 2.0:
                backoff = "exponential" if backoff in (None, "exponential") else backoff
            else:
                raise _Refuse(f"backoff_multiplier {mult} has no counterpart (exponential doubles)", retry,
                              "backoff_multiplier")  # fmt: skip
        if backoff is None and mult is None:
            backoff = "exponential"
        if backoff is not None:
            if str(backoff) not in BACKOFFS:
                raise _Refuse(f"backoff {backoff!r} is not one of {sorted(BACKOFFS)}", retry, "backoff")
            then["backoff"] = str(backoff)
        if delay is not None:
            then["delay"] = delay
        conds: list[str] = []
        raw_when = retry.get("when", retry.get("retry_when"))
        for c in raw_when if isinstance(raw_when, list) else ([raw_when] if raw_when is not None else []):
            expr = single_expression(c)
            if expr is None:
                raise _Refuse(f"retry condition {c!r} is not one `{{{{ expression }}}}`", retry, "when")
            conds.append(self._policy_expr(expr, kind, step_name, retry_names=True))
        statuses = retry.get("retry_on_status")
        if statuses is not None:
            codes = statuses if isinstance(statuses, list) else [statuses]
            conds.append(f"outcome.http.status in [{', '.join(str(c) for c in codes)}]")
        retry_on = retry.get("retry_on")
        if retry_on is not None:
            kinds = retry_on if isinstance(retry_on, list) else [retry_on]
            listed = ", ".join(f"'{k}'" for k in kinds)
            conds.append(f"outcome.status == 'error' and outcome.error.kind in [{listed}]")
        if not conds:
            cond = "outcome.status == 'error'"
        elif len(conds) == 1:
            cond = conds[0]
        else:
            cond = " or ".join(_group(c) for c in conds)
        return _cm(("when", _tmpl(cond)), ("then", _flow(then)))

    def _policy_expr(
        self, expr: str, kind: str | None, step_name: str | None, retry_names: bool = False
    ) -> str:
        """A legacy condition over the tool's response, as a policy condition over ``outcome``."""

        def resolver(ref: NameRef) -> tuple[str, int] | None:
            if ref.name in ("response", "result", "this"):
                return "outcome.result", 0
            if ref.name == "error":
                return "outcome.error", 0
            if ref.name == "data":
                return "outcome.result.data", 0
            if step_name and ref.name == step_name:
                return "outcome.result", 0
            if retry_names and ref.name == "status_code":  # the v1 retry context's names
                return "outcome.result.status_code", 0
            if retry_names and ref.name == "attempt":
                return "outcome.meta.attempt", 0
            if retry_names and ref.name == "success":
                return "(outcome.status == 'ok')", 0
            return None

        expr = rewrite_event_names(expr, self._policy_event)
        return rewrite_template("{{ " + expr + " }}", resolver)[3:-3]

    @staticmethod
    def _policy_event(name: str) -> Any:
        if name in ("call.done", "step.exit", "action_completed", "task_complete"):
            return "ok"
        if name in ("call.error", "action_error", "task_error"):
            return "error"
        raise _Refuse(f"event {name!r} has no task-outcome counterpart")

    # step-level retry -> a rule on the step's one task
    def _step_retry(self, s: CommentedMap, path: tuple) -> None:
        try:
            tasks = _task_items(s.get("tool"))
            if not tasks or len(tasks) != 1:
                raise _Refuse("a step `retry` needs exactly one task to attach to", s, "retry")
            raw = s["retry"]
            if raw is True or (isinstance(raw, int) and not isinstance(raw, bool) and raw > 0):
                raw = {} if raw is True else {"max_attempts": raw}  # `retry: true` / `retry: <attempts>`
            if not isinstance(raw, dict):
                raise _Refuse("`retry` is not a mapping, `true` or a number of attempts", s, "retry")
            rule = self._retry_rule(raw, str(tasks[0].body.get("kind")), s["step"])
            self._add_rules(tasks[0].body, [rule], s, "retry")
            _pop(s, "retry")
        except _Refuse as e:
            self.refuse(e, "retry", s, "retry", (*path, "retry"))

    # step vars -> step set (ctx writes)
    def _step_vars(self, s: CommentedMap, path: tuple) -> None:
        v = s["vars"]
        name = s["step"]
        try:
            if not isinstance(v, dict):
                raise _Refuse("`vars` is not a mapping", s, "vars")
            target = s.get("set")
            if target is not None and not isinstance(target, dict):
                raise _Refuse("`set` is not a mapping", s, "set")
            new = CommentedMap()
            for k in list(v.keys()):
                val = v[k]
                if isinstance(val, str):
                    val = _restyle(val, rewrite_template(val, self._self_result_resolver(name)))
                new[f"ctx.{k}"] = val
                if k in v.ca.items:
                    new.ca.items[f"ctx.{k}"] = v.ca.items[k]
            if target is None:
                pos = _index(s, "vars")
                _pop(s, "vars")
                s.insert(pos, "set", new)
            else:
                clash = sorted(set(new) & set(target))
                if clash:
                    raise _Refuse(f"`vars` and `set` both write {clash}", s, "vars")
                for k in new:
                    target[k] = new[k]
                _pop(s, "vars")
        except _Refuse as e:
            self.refuse(e, "step-vars", s, "vars", (*path, "vars"))
        except TemplateRewriteError as e:
            self.refuse(_Refuse(str(e)), "step-vars", s, "vars", (*path, "vars"))

    @staticmethod
    def _self_result_resolver(step_name: str) -> Resolver:
        def resolver(ref: NameRef) -> tuple[str, int] | None:
            if ref.name in ("result", "response", "this"):
                return step_name, 0
            return None

        return resolver
