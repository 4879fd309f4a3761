"""Task policy: which rule's `then` applies to an outcome, and the retry delay it asks for (SEMANTICS.md §4)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from noetl_dagster.dsl.parse_context import MAX_RETRY_DELAY
from noetl_dagster.dsl.template_front import TemplateError
from noetl_dagster.engine.frame import DEFAULT_RETRY_DELAY, _error
from noetl_dagster.engine.scope import Scope

if TYPE_CHECKING:
    from noetl_dagster.dsl.model import RuleThen, Task


class TaskPolicy:
    """The policy half of the worker: evaluated with the worker's template environment."""

    env: Any

    def _int(self, value: Any, scope: Scope, default: int) -> int:
        if value is None:
            return default
        v = self.env.render(value, scope) if isinstance(value, str) else value
        try:
            return int(v)
        except (TypeError, ValueError, OverflowError):  # int(inf) overflows
            return default

    def _retry_delay(self, then: RuleThen | None, attempt: int, scope: Scope) -> float:
        backoff = (then.backoff if then else None) or "fixed"
        if backoff == "none":
            return 0.0
        raw = then.delay if then else None
        v = self.env.render(raw, scope) if isinstance(raw, str) else raw
        try:
            delay = float(v) if v is not None else DEFAULT_RETRY_DELAY
        except (TypeError, ValueError, OverflowError):
            delay = DEFAULT_RETRY_DELAY
        if delay != delay:  # NaN
            delay = DEFAULT_RETRY_DELAY
        delay = min(max(delay, 0.0), MAX_RETRY_DELAY)  # 1e308 / inf would overflow the clock
        if backoff == "linear":
            delay *= attempt
        elif backoff == "exponential":
            delay *= 2.0 ** min(attempt - 1, 64)
        return min(delay, MAX_RETRY_DELAY)

    def _decide(
        self, task: Task, outcome: dict[str, Any], scope: Scope
    ) -> tuple[RuleThen | None, dict[str, Any] | None]:
        """The matching rule's ``then`` (None: the defaults apply), or an error when a condition fails."""
        if task.policy is None:
            return None, None
        pscope = scope.child(
            outcome=outcome, output=outcome, error=outcome.get("error"), result=outcome.get("result")
        )
        else_then = None
        for rule in task.policy:
            if rule.is_else:
                else_then = else_then or rule.then
                continue
            try:
                if self.env.truthy(rule.when, pscope):
                    return rule.then, None
            except TemplateError as e:
                return None, _error("template_error", f"policy rule of task {task.label!r}: {e}")
        return else_then, None
