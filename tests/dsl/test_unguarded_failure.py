"""Issue 42 part 4: ``validate`` warns (exit 0) about an arc without ``when`` after a step that can fail:
the spec routes ``step.failed`` through it, so the execution completes and a Dagster run stays green.
"Can fail": the step has a task of a kind other than ``noop``; an arc set that looks at the outcome
(``event``, ``error``, ``status``...) is the author's choice and is left alone; loop steps too."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from click.testing import CliRunner

from noetl_dagster.commands.main import cli
from noetl_dagster.dsl.files import check_file_with_warnings
from noetl_dagster.translator.component import SAMPLE_PLAYBOOK

REPO = Path(__file__).resolve().parents[2]
HEAD = """\
apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: w, path: tests/w}
workflow:
"""
RAISES = """\
  - step: start
    tool:
      - boom:
          kind: python
          code: |
            raise ValueError("no")
    next:
      arcs:
        - step: end@GUARD@
  - step: end
    tool: {kind: noop}
"""


def _write(tmp_path: Path, body: str) -> Path:
    f = tmp_path / "w.yaml"
    f.write_text(HEAD + textwrap.dedent(body))
    return f


def _warnings(f: Path) -> list[str]:
    pb, issues, warnings = check_file_with_warnings(f)
    assert pb is not None and not issues
    return [str(w) for w in warnings if w.rule == "unguarded-failure"]


def test_validate_warns_on_an_unguarded_arc_after_a_step_that_can_fail_and_exits_0(tmp_path):
    f = _write(tmp_path, RAISES.replace("@GUARD@", ""))
    r = CliRunner().invoke(cli, ["validate", str(f)])
    assert r.exit_code == 0, r.output
    (line,) = [ln for ln in r.stderr.splitlines() if "unguarded-failure" in ln]
    assert line.startswith(
        f"{f}:13: warning: unguarded-failure: workflow[0].next.arcs[0]: step 'start' can fail"
    )
    assert "task boom (python)" in line and "when: \"{{ event.name == 'call.done' }}\"" in line
    assert r.stdout.strip() == ""  # stdout stays the error list


@pytest.mark.parametrize(
    "guard",
    [
        "\n          when: \"{{ event.name == 'call.done' }}\"",
        "\n          when: \"{{ event.name == 'call.error' }}\"",
        "\n          when: \"{{ start.status == 'ok' }}\"",
    ],
)
def test_no_warning_when_an_arc_looks_at_the_outcome(tmp_path, guard):
    assert _warnings(_write(tmp_path, RAISES.replace("@GUARD@", guard))) == []


def test_an_earlier_guarded_arc_routes_the_failure_so_a_fallback_arc_is_fine(tmp_path):
    body = RAISES.replace("@GUARD@", "\n          when: \"{{ event.name == 'call.error' }}\"").replace(
        "        - step: end\n", "        - step: end\n        - step: end\n", 1
    )
    assert _warnings(_write(tmp_path, body)) == []


def test_no_warning_for_a_step_that_cannot_fail(tmp_path):
    noop = "  - step: start\n    tool: {kind: noop}\n    next: {arcs: [{step: end}]}\n  - step: end\n    tool: {kind: noop}\n"
    assert _warnings(_write(tmp_path, noop)) == []


LOOP = (
    "  - step: start\n    loop: {in: '{{ [1, 2] }}', iterator: x}\n"
    "    tool: {kind: python, code: 'result = 1'}\n    next: {arcs: [{step: end@GUARD@}]}\n"
    "  - step: end\n    tool: {kind: noop}\n"
)


def test_a_loop_step_whose_arc_routes_failed_iterations_on_warns_with_the_loop_guard(tmp_path):
    """SEMANTICS.md §4: a loop's arcs are evaluated once, on ``loop.done``; a loop with failed iterations
    is a failed step only when no arc routes it, so an arc without ``when`` hides the failed iterations."""
    (w,) = _warnings(_write(tmp_path, LOOP.replace("@GUARD@", "")))
    assert "step 'start' can fail (task task_0 (python), in a loop)" in w or ", in a loop)" in w
    assert w.endswith('guard it: when: "{{ start.stats.failed == 0 }}"')
    guarded = LOOP.replace("@GUARD@", ", when: '{{ start.stats.failed == 0 }}'")
    assert _warnings(_write(tmp_path, guarded)) == []


def test_one_warning_per_playbook_naming_the_other_steps(tmp_path):
    body = (
        "  - step: start\n    tool: {kind: python, code: 'result = 1'}\n    next: {arcs: [{step: mid}]}\n"
        "  - step: mid\n    tool: {kind: python, code: 'result = 2'}\n    next: {arcs: [{step: end}]}\n"
        "  - step: end\n    tool: {kind: noop}\n"
    )
    (w,) = _warnings(_write(tmp_path, body))
    assert "step 'start' can fail" in w and "(also: mid)" in w


@pytest.mark.parametrize(
    "path",
    [
        REPO / "noetl_dagster" / "translator" / SAMPLE_PLAYBOOK,  # what `dg scaffold` writes
        *sorted((REPO / "example_project" / "playbooks").glob("*.yaml")),
    ],
    ids=lambda p: p.name,
)
def test_the_samples_show_the_guard(path):
    """Every example playbook guards its arcs (or, where a failure is routed on purpose, says so with an
    explicit ``call.error`` condition and a comment): none warns."""
    assert _warnings(path) == []
