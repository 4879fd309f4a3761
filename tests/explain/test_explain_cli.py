"""``noetl-dagster explain`` / ``diff`` on real executions (issue 36)."""

from __future__ import annotations

import json
import shutil
import sqlite3

from conftest import PLAYBOOKS

from noetl_analytics.execution_view import ExecutionViews
from noetl_dagster.storage.event_stores import open_event_store


def _line(step: str, file=PLAYBOOKS / "explain_demo.yaml") -> int:
    return next(i for i, t in enumerate(file.read_text().splitlines(), 1) if t.strip() == f"- step: {step}")


def test_explain_shows_runs_retries_loop_arcs_and_the_error_line(run, noetl):
    eid = run("explain_demo.yaml", {"route": "right"})
    r = noetl("explain", eid)
    assert r.exit_code == 0, r.output
    out = r.output
    assert "failed" in out.splitlines()[0] and "tests/explain_demo" in out
    assert "6 step runs, 1 failed, 1 retries, 4 loop iterations" in out
    assert sum("  success  spin" in line for line in out.splitlines()) == 3
    assert "loop 4/4 ok, 0 failed" in out and "retries 1" in out
    lines = (PLAYBOOKS / "explain_demo.yaml").read_text().splitlines()
    raising = (
        lines.index('            raise RuntimeError("right side is broken")') + 1
    )  # the raise's playbook line
    where = f"{PLAYBOOKS / 'explain_demo.yaml'}:{raising}"
    assert f"error: RuntimeError: right side is broken ({where})" in out
    assert raising != _line("right")  # the raising line, not the step's (engine/error_location.py)
    assert "spin -> spin: 2 (back-edge)" in out and "fan -> left: 0" in out and "fan -> right: 1" in out
    data = json.loads(noetl("explain", eid, "--json").output)
    right = data["runs"][-1]
    assert (
        right["step"] == "right"
        and right["status"] == "error"
        and [a["attempt"] for a in right["attempts"]] == [1, 2]
    )
    assert data["graph"]["cyclic"] == ["spin"] and set(data["graph"]["positions"]) == {
        "start",
        "spin",
        "fan",
        "left",
        "right",
    }
    assert data["totals"]["cost"] > 0 and data["currency"]  # priced by the price table, from measured usage


def test_diff_names_the_arc_and_the_workload_that_decided_it(run, noetl):
    a, b = run("explain_demo.yaml", {"route": "left"}), run("explain_demo.yaml", {"route": "right"})
    r = noetl("diff", a, b)
    assert r.exit_code == 0, r.output
    assert "first divergence (arc): fan (activation 1) fired ['left'] in A, ['right'] in B" in r.output
    assert "workload.route: A left  B right" in r.output
    assert "arc 0 when: {{ workload.route == 'left' }}" in r.output
    d = json.loads(noetl("diff", a, b, "--json").output)
    assert (
        d["first"]["kind"] == "arc"
        and d["first"]["a_sequence"]
        and d["steps_only_in"] == {"a": ["left"], "b": ["right"]}
    )
    # the same input: the same path, results and retries
    same = noetl("diff", a, run("explain_demo.yaml", {"route": "left"}))
    assert "no divergence: 6 step activations agree" in same.output


def test_diff_finds_a_different_retry_count(run, noetl):
    a, b = run("retries.yaml", {"fail_times": 1}), run("retries.yaml", {"fail_times": 2})
    d = json.loads(noetl("diff", a, b, "--json").output)
    assert d["first"]["kind"] == "retries" and d["first"]["step"] == "start"
    assert (d["first"]["a_value"], d["first"]["b_value"]) == (1, 2)
    assert d["first"]["workload_diff"] == {"fail_times": {"a": 1, "b": 2}}


def test_diff_reports_the_first_event_where_the_logs_differ_a_task_error_before_its_arc(run, noetl, home):
    """A good and a failed run first differ at the task's task.done (success / error), not at the arc
    its error fired two events later (issue 42)."""
    a, b = run("error_arc.yaml", {"batch": [1, 2]}), run("error_arc.yaml", {"batch": [1, 0]})
    store = open_event_store(None, data_dir=str(home))
    ea, eb = store.read(a), store.read(b)
    first = next(
        i for i, (x, y) in enumerate(zip(ea, eb, strict=False)) if (x.name, x.status) != (y.name, y.status)
    )
    assert (ea[first].name, ea[first].status, eb[first].status) == ("task.done", "success", "error")
    d = json.loads(noetl("diff", a, b, "--json").output)["first"]
    assert d["kind"] == "status" and d["step"] == "start"
    assert (d["a_sequence"], d["b_sequence"]) == (ea[first].sequence, eb[first].sequence)
    assert d["why"] == "start (activation 1): task divide success in A, divide error in B"
    assert f"event: A #{ea[first].sequence}  B #{eb[first].sequence}" in noetl("diff", a, b).output


def test_diff_across_playbook_versions_matches_steps_by_name(run, noetl, tmp_path):
    v1 = tmp_path / "v1.yaml"
    shutil.copy(PLAYBOOKS / "explain_demo.yaml", v1)
    v2 = tmp_path / "v2.yaml"
    v2.write_text(v1.read_text().replace("result: {side: left}", "result: {side: LEFT}"))
    a, b = run(v1), run(v2)
    d = json.loads(noetl("diff", a, b, "--json").output)
    assert d["steps_changed"] == {"added": [], "removed": [], "changed": ["left"]}
    assert d["first"]["kind"] == "result" and d["first"]["step"] == "left"
    assert "steps changed between the versions: changed left" in noetl("diff", a, b).output


def test_unknown_ids_are_one_line_errors(run, noetl):
    eid = run("explain_demo.yaml")
    for args in (("explain", "no-such-id"), ("diff", eid, "no-such-id"), ("diff", "no-such-id", eid),
                 ("explain", "x" * 500)):  # fmt: skip
        r = noetl(*args)
        assert r.exit_code == 2, (args, r.output)
        assert r.output.startswith("error: ") and r.output.count("\n") == 1 and "Traceback" not in r.output


def test_a_big_loop_is_aggregated_and_pages(run, home):
    items = list(range(300))
    eid = run("loop300.yaml", {"items": items, "fail_at": 260})
    views = ExecutionViews(open_event_store(None, data_dir=home))
    page, exp = views.explained(eid)
    loop = page["runs"][0]["loop"]
    assert (loop["total"], loop["ok"], loop["failed"]) == (300, 299, 1)
    # the first 50 in detail, plus the failed one; the rest only in buckets
    assert [i["index"] for i in loop["iterations"]] == [*range(50), 260]
    assert sum(b["ok"] + b["failed"] for b in loop["buckets"]) == 300 and len(loop["buckets"]) <= 60
    rows = exp.iterations(page["runs"][0]["step_run_id"], 255, 10)["iterations"]
    assert [r["index"] for r in rows] == list(range(255, 265))
    bad = next(r for r in rows if r["index"] == 260)
    assert bad["status"] == "error" and "item 260 is bad" in json.dumps(bad["error"])


def test_a_page_of_a_running_execution_folds_only_the_events_after_its_summary(run, home, tmp_path):
    """The log grows past the summary (appended where it could not be kept, e.g. by an older
    writer): the page folds just those events and writes the summary back."""
    from noetl_dagster.engine.events import Event
    from noetl_dagster.storage.events import SqliteEventStore

    eid = run("loop300.yaml", {"items": list(range(300)), "fail_at": 7})
    path = tmp_path / "copy.db"  # a copy: its log may grow without the run's replay check
    SqliteEventStore(path).append(SqliteEventStore(home / "events.db").read(eid))
    fresh = ExecutionViews(SqliteEventStore(path)).explain(eid)
    first = SqliteEventStore(path).read(eid)[0]
    late = Event("ctx.patched", eid, {"patch": {"late": 1}, "source": "request"},
                 tenant_id=first.tenant_id, project_id=first.project_id)  # fmt: skip
    with sqlite3.connect(path) as c:  # an append that did not keep the summary (a store from before it)
        c.execute("INSERT INTO noetl_event (gid, event_id, execution_id, sequence, name, ts, body) VALUES"
                  " ((SELECT MAX(gid_last) FROM noetl_event_segment) + 1000, ?, ?, ?, ?, ?, ?)",
                  (late.event_id, eid, fresh["execution"]["last_sequence"] + 1, late.name, late.timestamp,
                   json.dumps(late.to_stored(envelope=False))))  # fmt: skip
    views = ExecutionViews(SqliteEventStore(path))
    grown = views.explain(eid)
    assert grown["execution"]["events"] == fresh["execution"]["events"] + 1
    assert views.reads == 2 and views.rebuilt == 0  # the request and the one new event
    assert SqliteEventStore(path).summary(eid)[0] == fresh["execution"]["last_sequence"] + 1  # written back


def test_control_characters_in_step_names_show_escaped(run, noetl):
    # a step named with terminal escapes (clear screen, set the title) must not drive the terminal
    eid = run("escape_steps.yaml")
    out = noetl("explain", eid).output
    assert "\x1b" not in out and "\x07" not in out
    assert "evil\\x1b[2J\\x1b]0;title\\x07" in out
    d = noetl("diff", eid, run("escape_steps.yaml")).output
    assert "\x1b" not in d and "no divergence" in d


def test_a_sub_playbook_links_to_its_own_execution(run, noetl):
    eid = run("parent.yaml")
    data = json.loads(noetl("explain", eid, "--json").output)
    (child,) = data["runs"][0]["sub_executions"]
    assert data["totals"]["sub_executions"] == 1 and f"sub {child}" in noetl("explain", eid).output
    sub = json.loads(noetl("explain", child, "--json").output)
    assert (
        sub["execution"]["parent_execution_id"] == eid
        and sub["execution"]["playbook"] == "tests/explain_child"
    )
