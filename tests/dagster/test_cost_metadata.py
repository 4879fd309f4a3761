"""Cost per execution on real Dagster runs (execute_in_process, instance_for_test): every op's result output
and every asset materialization carries ``noetl/cost/usd`` (+ components, price version) priced from the
measured usage of its task attempts with analytics/noetl_analytics/pricing.py (the allocation SQL's formula); the run that
finishes the execution is tagged ``noetl/cost_usd`` / ``noetl/price_version`` with the execution's total."""

from __future__ import annotations

import dagster as dg
import pytest
import yaml

from noetl_analytics.pricing import Cost, PriceTable, cost_of_events
from noetl_dagster.engine.usage_lines import created_refs
from noetl_dagster.resources.noetl import NoetlResource
from noetl_dagster.storage.event_stores import open_event_store
from noetl_dagster.translator import compile_playbooks

PRICES = """\
currency: USD
allocation:
  - version: t-1
    valid_from: 2000-01-01
    cpu_core_hour: 36.0      # 1 cent per CPU-second: the test's few CPU-seconds are cents, not micro-cents
    ram_gb_hour: 3.6
    egress_gb: 0.09
    shot: 0.0009
    qpu_second: 1.6
"""

PLAYBOOK = """\
apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: cost_probe, path: tests/cost_probe}
workload: {n: 100000}
workflow:
  - step: start
    tool:
      - crunch:
          kind: python
          input: {n: "{{ workload.n }}"}
          code: |
            t = 0
            for i in range(n):
                t += i * i
            result = {"ratio": t / 0}
    next:
      arcs:
        - step: repair
          when: "{{ event.name == 'call.error' }}"
  - step: repair
    tool:
      - rows:
          kind: python
          input: {n: "{{ workload.n }}"}
          code: |
            t = 0
            for i in range(n):
                t += i % 7
            result = [{"k": i, "v": t % (i + 1)} for i in range(50)]
      - save_a:
          kind: parquet
          uri: noetl://demo/examples/costs/dataset/cost_probe_a
          data: "{{ rows }}"
      - save_b:
          kind: parquet
          uri: noetl://demo/examples/costs/dataset/cost_probe_b
          data: "{{ rows }}"
"""


def _run(tmp_path, prices: str | None):  # noqa: ANN001, ANN202
    pb = tmp_path / "cost_probe.yaml"
    pb.write_text(PLAYBOOK)
    data = tmp_path / "noetl"
    data.mkdir()
    if prices is not None:
        (data / "prices.yaml").write_text(prices)  # <data dir>/prices.yaml, as `facts refresh` reads it
    res = NoetlResource(data_dir=str(data), tenant="demo", project="examples")
    loc = compile_playbooks(pb, resource=res, include_sensor=False)
    instance = dg.instance_for_test()
    inst = instance.__enter__()
    result = loc.definitions.resolve_job_def("cost_probe").execute_in_process(
        instance=inst, raise_on_error=False
    )
    return instance, inst, result, data


def _results_metadata(result):  # noqa: ANN001, ANN202
    """(op name, metadata values) of every op's ``result`` output."""
    for node in result.job_def.nodes:
        for ev in result.events_for_node(node.name):
            if ev.event_type_value == "STEP_OUTPUT" and ev.step_output_data.output_name == "result":
                yield node.name, {k: getattr(v, "value", v) for k, v in ev.step_output_data.metadata.items()}


def _result_metadata(result, step: str) -> dict:  # noqa: ANN001
    for name, md in _results_metadata(result):
        if name.endswith(step):
            return md
    raise AssertionError(f"no result output for {step}")


def _attempts(data, execution_id: str, name: str | None = "task.done") -> dict[str, list]:  # noqa: ANN001
    """The execution's events by step: its task attempts, or every event (``name`` None)."""
    log = open_event_store(None, data_dir=data)
    try:
        events = log.read(execution_id)
    finally:
        log.close()
    out: dict[str, list] = {}
    for e in events:
        if name is None or e.name == name:
            out.setdefault(e.step or "", []).append(e)
    return out


def _cost(prices: PriceTable, events: list) -> Cost:
    """Every usage line of ``events`` (attempts, stored tables, platform), as the ops price them."""
    return sum(cost_of_events(prices, events).values(), Cost(currency=prices.currency))


def test_cost_metadata_and_run_tags_equal_the_formula(tmp_path):
    instance, inst, result, data = _run(tmp_path, PRICES)
    try:
        assert result.success
        run = inst.get_run_by_id(result.run_id)
        eid = run.tags["noetl/execution_id"]
        prices = PriceTable.from_dict(yaml.safe_load(PRICES))
        attempts, events = _attempts(data, eid), _attempts(data, eid, None)
        assert {s: len(a) for s, a in attempts.items()} == {"start": 1, "repair": 3}
        assert attempts["start"][0].data["outcome"]["status"] == "error"  # failed attempts cost too

        def formula(step: str) -> Cost:
            return _cost(prices, events[step])

        for step in ("start", "repair"):
            md, want = _result_metadata(result, step), formula(step)
            assert md["noetl/cost/usd"] == pytest.approx(want.total, rel=1e-12) and want.total > 0
            for c in ("cpu", "ram", "gpu", "egress", "storage", "call", "shot", "qpu", "platform"):
                assert md.get(f"noetl/cost/{c}_usd", 0.0) == pytest.approx(
                    getattr(want, c), rel=1e-12, abs=1e-15
                )
                assert (f"noetl/cost/{c}_usd" in md) == (getattr(want, c) != 0)  # no zero lines (issue 42)
            assert not [k for k, v in md.items() if k.startswith("noetl/cost/") and v == 0]
            assert md["noetl/cost/price_version"] == "t-1" and md["noetl/cost/attempts"] == len(
                attempts[step]
            )
            # the CPU line is the op's measured CPU (its usage metadata) in core-hours x the core-hour price
            cpu_s = md["noetl/usage/cpu_s"] + md.get("noetl/usage/child_cpu_s", 0)
            assert md["noetl/cost/cpu_usd"] == pytest.approx(cpu_s / 3600 * 36.0, rel=1e-9)
        # the two tables `repair` stored: each carries half the step's cost, so a sum over assets is the step's
        mats = [ev.event_specific_data.materialization for ev in result.all_events
                if ev.event_type_value == "ASSET_MATERIALIZATION"
                and ev.event_specific_data.materialization.asset_key.path[0] != "noetl_cost"]  # fmt: skip
        assert sorted(m.asset_key.path[-1] for m in mats) == ["cost_probe_a", "cost_probe_b"]
        repair = formula("repair")
        for m in mats:
            md = {k: getattr(v, "value", v) for k, v in m.metadata.items()}
            assert md["noetl/cost/usd"] == pytest.approx(repair.total / 2, rel=1e-12)
            assert md["noetl/cost/share"] == 0.5 and md["noetl/cost/price_version"] == "t-1"
            assert not [k for k, v in md.items() if k.startswith("noetl/cost/") and v == 0]
        # the asset's materialization history (what Insights reads) has the numeric key
        latest = inst.get_latest_materialization_event(dg.AssetKey(mats[0].asset_key.path))
        assert latest.asset_materialization.metadata["noetl/cost/usd"].value > 0
        # the run that finished the execution carries the execution's total cost and price version
        total = _cost(prices, [e for evs in events.values() for e in evs])
        assert run.tags["noetl/status"] == "completed"
        assert float(run.tags["noetl/cost_usd"]) == pytest.approx(total.total, rel=1e-9, abs=1e-12)
        assert run.tags["noetl/price_version"] == "t-1"
    finally:
        instance.__exit__(None, None, None)


def test_a_bad_price_file_never_fails_the_run(tmp_path):
    instance, inst, result, _ = _run(tmp_path, "allocation: [{cpu_core_hour: -1}]\n")
    try:
        assert result.success
        md = _result_metadata(result, "repair")
        assert "noetl/usage/cpu_s" in md and not any(k.startswith("noetl/cost/") for k in md)
        assert "noetl/cost_usd" not in inst.get_run_by_id(result.run_id).tags
        warnings = [
            e.user_message for e in inst.all_logs(result.run_id) if "no cost metadata" in e.user_message
        ]
        assert warnings and "cpu_core_hour must be a non-negative number" in warnings[0]
    finally:
        instance.__exit__(None, None, None)


LOOP = """\
apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: cost_frames, path: tests/cost_frames}
workflow:
  - step: start
    loop:
      in: "{{ range(40) | list }}"
      iterator: x
      spec: {mode: parallel, dagster: {frame_size: 8}}
    tool:
      - square:
          kind: python
          input: {x: "{{ iter.x }}"}
          code: |
            result = {"sq": x * x}
    next: {arcs: [{step: total}]}
  - step: total
    tool:
      - sum:
          kind: python
          input: {rows: "{{ start.results }}"}
          code: |
            result = sum(r["sq"] for r in rows)
"""


def test_a_loop_run_as_frames_is_priced_on_its_collect_op(tmp_path):
    """The collect op reports the loop step run: all its iterations' attempts, recorded by the frame ops
    (the log window widens past the op's own events until it holds the step run's scheduling)."""
    pb = tmp_path / "cost_frames.yaml"
    pb.write_text(LOOP)
    data = tmp_path / "noetl"
    data.mkdir()
    (data / "prices.yaml").write_text(PRICES)
    loc = compile_playbooks(pb, resource=NoetlResource(data_dir=str(data)), include_sensor=False)
    with dg.instance_for_test() as inst:
        result = loc.definitions.resolve_job_def("cost_frames").execute_in_process(instance=inst)
        assert result.success
        assert {n.name for n in result.job_def.nodes} >= {"start", "start__frame", "start__collect", "total"}
        run = inst.get_run_by_id(result.run_id)
        attempts = _attempts(data, run.tags["noetl/execution_id"])
        events = _attempts(data, run.tags["noetl/execution_id"], None)
        assert len(attempts["start"]) == 40
        prices = PriceTable.from_dict(yaml.safe_load(PRICES))
        md = _result_metadata(result, "start__collect")
        loop = _cost(prices, events["start"])
        assert md["noetl/cost/attempts"] == 40
        assert md["noetl/cost/usd"] == pytest.approx(loop.total, rel=1e-12) and loop.total > 0
        total = _cost(prices, [e for evs in events.values() for e in evs])
        assert float(run.tags["noetl/cost_usd"]) == pytest.approx(total.total, rel=1e-9, abs=1e-12)


def test_each_per_step_run_carries_its_own_cost_and_the_finishing_run_the_total(
    dagster_data, ephemeral_instance
):
    """Per-step jobs (the router launches one run per token): every run of one op is tagged
    ``noetl/run_cost_usd`` with its step's attempts; the run that finishes the execution also gets
    ``noetl/cost_usd``, the whole execution: the runs' own costs plus its platform line."""
    from dagster_helpers import EXAMPLES

    from noetl_dagster.sensors.router import RouterCursor, instance_run_lookup, router_tick
    from noetl_dagster.translator.runner import run_playbook_dagster

    dagster_data.mkdir(parents=True, exist_ok=True)
    (dagster_data / "prices.yaml").write_text(PRICES)
    path = EXAMPLES / "per_step_pipeline.yaml"
    loc = compile_playbooks([path], resource=NoetlResource(data_dir=str(dagster_data)))
    eid = run_playbook_dagster(path, data_dir=dagster_data, detach=True).execution_id
    svc, cursor, runs = loc.index.resource.services(), RouterCursor(), {}
    for _ in range(10):
        tick = router_tick(loc.index, svc, instance_run_lookup(ephemeral_instance), cursor)
        cursor = tick.cursor
        if not tick.launches:
            break
        for la in tick.launches:
            job = loc.definitions.resolve_job_def(la.job_name)
            res = job.execute_in_process(
                instance=ephemeral_instance, tags={**la.tags, "dagster/run_key": la.run_key}
            )
            assert res.success
            runs[la.tags.get("noetl/step") or "noetl_start"] = res.run_id
    assert set(runs) >= {"start", "total", "maximum", "combine"}
    prices = PriceTable.from_dict(yaml.safe_load(PRICES))
    events = _attempts(dagster_data, eid, None)
    own = {}
    for step in ("start", "total", "maximum", "combine"):
        tags = ephemeral_instance.get_run_by_id(runs[step]).tags
        expected = _cost(prices, events[step])
        own[step] = float(tags["noetl/run_cost_usd"])
        assert own[step] == pytest.approx(expected.total, rel=1e-9, abs=1e-12) and own[step] > 0
        assert tags["noetl/price_version"] == "t-1"
    finishing = [s for s, r in runs.items() if "noetl/cost_usd" in ephemeral_instance.get_run_by_id(r).tags]
    assert finishing == ["combine"]
    total = float(ephemeral_instance.get_run_by_id(runs["combine"]).tags["noetl/cost_usd"])
    # the execution's total is its steps' own costs plus the engine's CPU for it (the platform line)
    platform = _cost(prices, events.get("", []))
    assert platform.platform > 0 and platform.total == platform.platform
    assert total == pytest.approx(sum(own.values()) + platform.total, rel=1e-9, abs=1e-9)
    # the finishing run's cost summary, under the playbook job's name: the per-step runs' own costs +
    # its run line = the execution; no table stored, so the assets lens is the summary alone
    summary = ephemeral_instance.get_latest_materialization_event(
        dg.AssetKey(["noetl_cost", "per_step_pipeline"])
    )
    assert summary is not None and summary.run_id == runs["combine"]
    md = {k: getattr(v, "value", v) for k, v in summary.asset_materialization.metadata.items()}
    assert sum(own.values()) + md["noetl/cost/run_usd"] == pytest.approx(total, abs=1e-9)
    assert md["noetl/cost/usd"] == pytest.approx(total, abs=1e-9) and md["noetl/cost/tables_usd"] == 0


PASSED_ON = """\
apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: cost_passed_on, path: tests/cost_passed_on}
workflow:
  - step: start
    tool:
      - publish:
          kind: python
          code: |
            result = {"uri": "noetl://demo/examples/reports/dataset/daily", "store": "file",
                      "format": "json", "size": 40000, "checksum": "sha256:00"}
    next: {arcs: [{step: churn}]}
  - step: churn
    loop:
      in: "{{ range(12) | list }}"
      iterator: x
    tool:
      - square:
          kind: python
          input: {x: "{{ iter.x }}"}
          code: |
            result = {"sq": x * x}
    next: {arcs: [{step: relay}]}
  - step: relay
    tool:
      - pass_on:
          kind: python
          input: {report: "{{ start }}"}
          code: |
            result = report
"""


def test_an_op_passing_on_a_reference_an_earlier_op_billed_adds_nothing(tmp_path):
    """``relay`` returns the reference ``start`` stored, far enough down the log that its op's window
    (the tail holding its own step run) does not hold ``start``'s events: the op is priced with the
    references billed before its window, so the ops' metadata sums to the execution's cost (without
    that seed the relay op billed the 20 USD write a second time)."""
    pb = tmp_path / "cost_passed_on.yaml"
    pb.write_text(PASSED_ON)
    data = tmp_path / "noetl"
    data.mkdir()
    (data / "prices.yaml").write_text(PRICES + "    storage_gb_month: 500000.0\n")
    loc = compile_playbooks(pb, resource=NoetlResource(data_dir=str(data), tenant="demo", project="examples"),
                            include_sensor=False)  # fmt: skip
    with dg.instance_for_test() as inst:
        result = loc.definitions.resolve_job_def("cost_passed_on").execute_in_process(instance=inst)
        assert result.success
        run = inst.get_run_by_id(result.run_id)
    eid = run.tags["noetl/execution_id"]
    events = _attempts(data, eid, None)
    prices = PriceTable.from_dict(yaml.safe_load(PRICES + "    storage_gb_month: 500000.0\n"))
    uri = "noetl://demo/examples/reports/dataset/daily"
    # the case: relay names start's reference again, more than an op's first window (16) after it
    named = [e.sequence for evs in events.values() for e in evs
             if any(r.get("uri") == uri for r in created_refs(e.name, e.data))]  # fmt: skip
    last_relay = max(e.sequence for e in events["relay"])
    assert {e.step for evs in events.values() for e in evs if e.sequence in named} == {"start", "relay"}
    assert last_relay - 16 > max(e.sequence for e in events["start"])
    whole = _cost(prices, [e for evs in events.values() for e in evs])
    assert whole.storage == pytest.approx(40000 / 1e9 * 500000.0) and whole.storage > 1  # billed once
    ops = sum(md.get("noetl/cost/usd", 0.0) for _, md in _results_metadata(result))
    assert "noetl/cost/storage_usd" not in _result_metadata(result, "relay")  # billed by start: no zero line
    assert ops == pytest.approx(whole.total - whole.platform, abs=1e-9)
    assert float(run.tags["noetl/cost_usd"]) == pytest.approx(whole.total, abs=1e-9)
