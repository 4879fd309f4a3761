"""``loop.cursor`` validation (issue 17.2): one clear rule per mistake, as NoETL's Loop model requires."""

from __future__ import annotations

import pytest

from noetl_dagster.dsl import load_playbook_dict
from noetl_dagster.dsl.parse import PlaybookInvalid


def _pb(loop):
    return {"apiVersion": "noetl.io/v2", "kind": "Playbook", "metadata": {"name": "c", "path": "c"},
            "workflow": [{"step": "start", "loop": loop, "tool": {"kind": "noop"}}]}  # fmt: skip


GOOD = {"cursor": {"kind": "postgres", "auth": "pg", "claim": "UPDATE q SET s = 1 RETURNING id"},
        "iterator": "row", "spec": {"mode": "cursor", "max_in_flight": 4,
                                    "frame": {"max_rows": 10, "lease_seconds": 30, "heartbeat_seconds": 5}}}  # fmt: skip


def test_a_cursor_loop_parses_with_its_frame_policy():
    loop = load_playbook_dict(_pb(GOOD)).workflow[0].loop
    assert loop.mode == "cursor" and loop.cursor.kind == "postgres" and loop.max_in_flight == 4
    assert loop.frame_policy.max_rows == 10 and loop.frame_policy.lease_seconds == 30
    assert loop.frame_policy.process == "row" and loop.frame_policy.max_attempts == 3  # NoETL's defaults


@pytest.mark.parametrize(
    "change,rule,text",
    [
        (lambda lp: lp["spec"].pop("mode"), "loop-mode", "`loop.cursor` needs `spec.mode: cursor`"),
        (lambda lp: lp.update({"in": "{{ [1] }}"}), "loop-source", "either `in`"),
        (
            lambda lp: lp["cursor"].update({"kind": "redis"}),
            "cursor-kind",
            "'redis' is not one of postgres, duckdb, nats_stream",
        ),
        (lambda lp: lp["cursor"].pop("claim"), "cursor-claim", "claim statement"),
        (lambda lp: lp["cursor"].update({"claims": "x"}), "cursor-shape", "unknown cursor key 'claims'"),
        (lambda lp: lp["spec"]["frame"].update({"max_rows": 0}), "loop-frame", "greater than or equal to 1"),
        (lambda lp: lp["spec"]["frame"].update({"process": "batch"}), "loop-frame", "'row' or 'frame'"),
        (lambda lp: lp.pop("iterator"), "loop-in-iterator", "iterator"),
    ],
)
def test_cursor_loop_mistakes_are_named(change, rule, text):
    import copy

    loop = copy.deepcopy(GOOD)
    change(loop)
    with pytest.raises(PlaybookInvalid) as e:
        load_playbook_dict(_pb(loop))
    issues = [i for i in e.value.issues if i.rule == rule]
    assert issues and text in issues[0].message, e.value.issues


def test_mode_cursor_without_a_cursor_is_an_error():
    with pytest.raises(PlaybookInvalid) as e:
        load_playbook_dict(_pb({"in": "{{ [1] }}", "iterator": "x", "spec": {"mode": "cursor"}}))
    assert any(i.rule == "loop-mode" and "needs a `loop.cursor`" in i.message for i in e.value.issues)
