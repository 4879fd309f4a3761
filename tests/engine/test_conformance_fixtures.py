"""Acceptance runs of the public e2e fixtures that need nothing external."""

from __future__ import annotations

import pytest


@pytest.fixture
def fixture_path(conformance_dir):
    def _p(rel: str):
        p = conformance_dir / rel
        assert p.is_file(), f"conformance fixture missing: {p}"
        return p

    return _p


def test_hello_world(run_pb, fixture_path):
    r = run_pb(fixture_path("hello_world/hello_world.yaml"))
    assert r.status == "completed"
    assert r.started_steps() == ["start", "test_step", "end"]
    assert r.results["test_step"] == {"status": "ok", "data": {"message": "Hello World"}}
    assert r.results["end"] == {"status": "complete"}


def test_hello_world_workload_override(run_pb, fixture_path):
    r = run_pb(fixture_path("hello_world/hello_world.yaml"), {"message": "hi"})
    assert r.results["test_step"]["data"]["message"] == "hi"


def test_control_flow_workbook_hot(run_pb, fixture_path):
    r = run_pb(fixture_path("control_flow_workbook/control_flow_workbook.yaml"), {"temperature_c": 30})
    assert r.status == "completed"
    assert r.runs == {"start": 1, "eval_flag": 1, "hot_path": 1, "hot_task_a": 1, "hot_task_b": 1, "end": 1}
    assert r.results["eval_flag"] == {"is_hot": True, "message": "hot"}
    end = r.index("step.started", "end")
    assert len(end) == 1
    assert max(r.index("step.done", "hot_task_a") + r.index("step.done", "hot_task_b")) < end[0]


def test_control_flow_workbook_cold(run_pb, fixture_path):
    r = run_pb(fixture_path("control_flow_workbook/control_flow_workbook.yaml"), {"temperature_c": 10})
    assert r.status == "completed"
    assert r.runs == {"start": 1, "eval_flag": 1, "cold_path": 1, "cold_task": 1, "end": 1}
    assert r.results["eval_flag"] == {"is_hot": False, "message": "cold"}
    assert r.started_steps() == ["start", "eval_flag", "cold_path", "cold_task", "end"]


def test_control_flow_workbook_default_workload_is_hot(run_pb, fixture_path):
    r = run_pb(fixture_path("control_flow_workbook/control_flow_workbook.yaml"))
    assert "hot_path" in r.runs and "cold_path" not in r.runs and r.runs["end"] == 1


def test_fanout_reduce_phase6(run_pb, fixture_path):
    r = run_pb(fixture_path("fanout_reduce/fanout_reduce_phase6.yaml"))
    assert r.status == "completed"
    assert r.runs == {"start": 1, "normalize_customer": 1, "enrich_customer": 1, "reduce_customer": 1}
    (reduce_start,) = r.index("step.started", "reduce_customer")
    (reduce_done,) = r.index("step.done", "reduce_customer")
    branches_done = r.index("step.done", "normalize_customer") + r.index("step.done", "enrich_customer")
    assert len(branches_done) == 2 and max(branches_done) < reduce_start < reduce_done
    assert len(r.named("step.scheduled", "reduce_customer")[0].data["token_ids"]) == 2
    assert r.results["reduce_customer"] == {"reduced": True}


def test_loop_instance_isolation(run_pb, fixture_path):
    r = run_pb(fixture_path("test_loop_instance_isolation/playbook.yaml"))
    assert r.status == "completed"
    v = r.results["verify_results"]
    assert v["verification"] == "Both loops completed independently"
    assert v["users_count"] == 2 and v["products_count"] == 2
    assert [x["name"] for x in r.results["process_items_users"]["results"]] == ["Alice", "Bob"]
    assert [x["name"] for x in r.results["process_items_products"]["results"]] == ["Laptop", "Mouse"]
    assert len({e.loop_id for e in r.named("loop.started")}) == 2


def test_vars_block(run_pb, fixture_path):
    r = run_pb(fixture_path("vars_test/test_vars_block.yaml"))
    assert r.status == "completed"
    assert r.ctx == {
        "first_user_id": 123,
        "first_email": "alice@example.com",
        "user_count": 2,
        "data_source": "test_db",
    }
    v = r.results["verify_vars"]
    assert v["status"] == "success" and all(v["checks"].values())


def test_user_profile_scorer(run_pb, fixture_path):
    r = run_pb(fixture_path("playbook_composition/user_profile_scorer.yaml"))
    assert r.status == "completed"
    res = r.results["finalize_result"]
    # by hand: experience 5y -> 15 pts * 0.4; rating 4.0 -> 18.8 pts * 0.35; Engineering 15 * 0.15; age 30 -> 10 * 0.1
    assert res["score_breakdown"] == pytest.approx(
        {"experience": 6.0, "performance": 6.58, "department": 2.25, "age": 1.0}
    )
    assert res["profile_score"] == 15.8
    assert res["score_category"] == "Junior"
    assert res["user_name"] == "TestUser"
    assert res["execution_id"] == "standalone_execution" and res["processing_status"] == "completed"
    assert all(
        r.runs[s] == 1 for s in ("score_experience", "score_performance", "score_department", "score_age")
    )


def test_user_profile_scorer_as_a_sub_playbook_by_catalog_path(run_pb, fixture_path, write_pb):
    """The parent fixture needs Postgres; the same call shape, by metadata.path, without it."""
    fixture_path("playbook_composition/user_profile_scorer.yaml")
    parent = write_pb("""
        apiVersion: noetl.io/v2
        kind: Playbook
        metadata: {name: composition_local, path: tests/composition_local}
        workload:
          users:
            - {name: Diana, age: 42, department: Management, years_experience: 15, performance_rating: 4.0}
        workflow:
          - step: start
            loop: {in: "{{ users }}", iterator: user}
            tool:
              - name: save_profile
                kind: playbook
                path: fixtures/playbooks/playbook_composition/user_profile_scorer
                return_step: finalize_result
                input:
                  user_data: "{{ user }}"
                  execution_context: "{{ execution_id }}"
        """)
    from noetl_dagster.runners.local import run_playbook

    res = run_playbook(
        parent, catalog_dirs=[fixture_path("playbook_composition/user_profile_scorer.yaml").parent]
    )
    assert res.status == "completed"
    (scored,) = res.results["start"]["results"]
    # 15y -> 30 * 0.4 + 18.8 * 0.35 + Management 12 * 0.15 + age 42 -> 8 * 0.1
    assert scored["user_name"] == "Diana" and scored["profile_score"] == 21.2
    assert scored["execution_id"] != res.execution_id  # the child's execution id
