"""The headless demo command runs example playbooks through a real Dagster instance."""

from __future__ import annotations

import dagster as dg
from click.testing import CliRunner

from noetl_dagster.commands.main import cli


def test_demo_runs_examples_and_says_where_to_look(tmp_path):
    res = CliRunner().invoke(
        cli, ["demo", "--home", str(tmp_path), "--only", "hello_dagster", "--only", "countdown_cycle"]
    )
    assert res.exit_code == 0, res.output
    assert "2 playbooks in" in res.output
    assert res.output.count("completed") >= 4  # progress lines and table rows
    assert "Where to look next" in res.output and "noetl-dagster events" in res.output
    instance = dg.DagsterInstance.from_config(str(tmp_path / ".dagster_home"))
    try:
        runs = instance.get_runs()
        assert {r.job_name for r in runs} == {"hello_dagster", "countdown_cycle"}
        assert all(r.tags.get("noetl/execution_id") for r in runs)
    finally:
        instance.dispose()
    assert (tmp_path / ".noetl" / "events.db").is_file()


def test_demo_rejects_an_unknown_playbook(tmp_path):
    res = CliRunner().invoke(cli, ["demo", "--home", str(tmp_path), "--only", "nope"])
    assert res.exit_code == 2 and "no example playbook named nope" in res.output
