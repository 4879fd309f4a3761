"""``noetl-dagster lineage export|validate`` over a real event log."""

from __future__ import annotations

import json

from click.testing import CliRunner

from noetl_dagster.commands.main import cli


def test_export_validates_and_writes_json_lines(lineage_runs, validator, tmp_path, monkeypatch):
    for key in [k for k in __import__("os").environ if k.startswith("OPENLINEAGE")]:
        monkeypatch.delenv(key)
    monkeypatch.chdir(tmp_path)
    data_dir, events, _ = lineage_runs
    runner = CliRunner()
    out = tmp_path / "ol.jsonl"
    result = runner.invoke(
        cli, ["lineage", "export", "--data-dir", str(data_dir), "--validate", "--out", str(out)]
    )
    assert result.exit_code == 0, result.output
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert f"emitted {len(lines)} OpenLineage events" in result.output
    assert all(validator.errors(ev) == [] for ev in lines)
    # only one execution (and the sub-playbooks it started), to the embedded default file
    top = next(
        e
        for e in events
        if e.name == "playbook.execution.requested" and e.data["name"] == "customer_portfolio"
    )
    result = runner.invoke(
        cli, ["lineage", "export", "--data-dir", str(data_dir), "--execution", top.execution_id]
    )
    assert result.exit_code == 0, result.output
    default = data_dir / "lineage" / "openlineage.jsonl"
    jobs = {json.loads(line)["job"]["name"] for line in default.read_text().splitlines()}
    assert jobs == {
        "examples/customer_portfolio",
        "examples/customer_portfolio.start",
        "examples/customer_portfolio.tally",
        "examples/score_customer",
        "examples/score_customer.start",
    }
    assert runner.invoke(cli, ["lineage", "validate", str(out), str(default)]).exit_code == 0


def test_validate_reports_bad_lines_and_bad_input(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"eventTime": "2026-01-01T00:00:00Z"}\nnot json\n')
    result = CliRunner().invoke(cli, ["lineage", "validate", str(bad)])
    assert result.exit_code == 1
    assert "bad.jsonl:1:" in result.output and "bad.jsonl:2: not JSON" in result.output
    assert CliRunner().invoke(cli, ["lineage", "validate", str(tmp_path / "missing.jsonl")]).exit_code == 2


def test_validate_reports_a_run_that_never_ends(lineage_runs, tmp_path):
    """Each event is valid alone, but the stream breaks the lifecycle rule: exit 1, named."""
    data_dir, _, _ = lineage_runs
    out = tmp_path / "all.jsonl"  # its own export: no reliance on another test having written one
    assert (
        CliRunner()
        .invoke(cli, ["lineage", "export", "--data-dir", str(data_dir), "--out", str(out)])
        .exit_code
        == 0
    )
    lines = out.read_text().splitlines()
    kept = [ln for ln in lines if json.loads(ln)["eventType"] not in ("COMPLETE", "FAIL")]
    broken = tmp_path / "no_end.jsonl"
    broken.write_text("\n".join(kept) + "\n")
    result = CliRunner().invoke(cli, ["lineage", "validate", str(broken)])
    assert result.exit_code == 1
    assert "never ends" in result.output and "problems across events" in result.output
