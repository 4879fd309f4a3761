"""What a playbook model does beyond its fields, without pydantic: the bases of both of its forms.

``dsl.model`` (pydantic, validated) and ``dsl.ready`` (its pydantic-free twins, the ready-to-run
form of a cached playbook, issue 35) inherit these, so the engine's questions (``steps``,
``entry_step``, ``targets`` ...) are answered by one piece of code for both. What needs pydantic
(``Loop.frame_policy``, ``Playbook.dagster``) stays on the models; a twin answers it through its model.
"""

from __future__ import annotations

from typing import Any


def is_template(value: Any) -> bool:
    return isinstance(value, str) and ("{{" in value or "{%" in value)


class SetBlockBase:
    __slots__ = ()

    def __bool__(self) -> bool:
        return bool(self.ctx or self.iter)  # type: ignore[attr-defined]


class PolicyRuleBase:
    __slots__ = ()

    @property
    def is_else(self) -> bool:
        return self.when is None  # type: ignore[attr-defined]


class OutputCheckBase:
    __slots__ = ()

    @property
    def kind(self) -> str:
        given = {
            "row_count": self.row_count,  # type: ignore[attr-defined]
            "schema": self.schema_,  # type: ignore[attr-defined]
            "freshness": self.freshness,  # type: ignore[attr-defined]
            "assert": self.assert_,  # type: ignore[attr-defined]
        }
        return next((k for k, v in given.items() if v is not None), "assert")


class StepBase:
    __slots__ = ()

    @property
    def targets(self) -> list[str]:
        return [a.step for a in self.next.arcs] if self.next else []  # type: ignore[attr-defined]


class PlaybookBase:
    """What the engine asks a playbook beyond its fields; ``isinstance(x, PlaybookBase)`` holds for both forms."""

    __slots__ = ()

    @property
    def steps(self) -> dict[str, Any]:
        if self._steps is None:  # type: ignore[attr-defined]
            self._steps = {s.name: s for s in self.workflow}  # type: ignore[attr-defined]
        return self._steps  # type: ignore[attr-defined]

    def step(self, name: str) -> Any:
        return self.steps[name]

    def workbook_entry(self, name: str) -> Any:
        for w in self.workbook:  # type: ignore[attr-defined]
            if w.name == name:
                return w
        return None

    @property
    def entry_step(self) -> str:
        entry = self.executor.spec.get("entry_step")  # type: ignore[attr-defined]
        if entry:
            return str(entry)
        if "start" in self.steps:
            return "start"
        return self.workflow[0].name  # type: ignore[attr-defined]

    @property
    def name(self) -> str:
        return self.metadata.name  # type: ignore[attr-defined]

    @property
    def base_dir(self) -> str | None:
        import os  # noqa: PLC0415

        source = self.source_file  # type: ignore[attr-defined]
        return os.path.dirname(os.path.abspath(source)) if source else None
