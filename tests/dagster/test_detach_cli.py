"""``noetl-dagster run --runner dagster --detach`` (issue 22.4): it prints the request id and how to
follow it, keeps one tenant/project for the execution, and refuses to record a request where no code
location would read it."""

from __future__ import annotations

import re

from click.testing import CliRunner
from dagster_helpers import EXAMPLES

from noetl_dagster.commands.main import cli
from noetl_dagster.storage.event_stores import open_event_store

HELLO = str(EXAMPLES / "hello_dagster.yaml")


def test_detach_prints_the_request_and_how_to_follow_it(dagster_data):
    args = ["run", "--runner", "dagster", "--detach", "--data-dir", str(dagster_data), "--tenant", "demo",
            "--project", "examples", HELLO]  # fmt: skip
    out = CliRunner().invoke(cli, args, env={"NOETL_DAGSTER_HOME": None, "NOETL_EVENT_STORE_URL": None})
    assert out.exit_code == 0, out.output
    eid = re.search(r"requested execution (\S+) of examples/hello_dagster", out.output).group(1)
    assert f"follow: noetl-dagster events {eid} --data-dir {dagster_data.resolve()}" in out.output
    assert f"noetl/execution_id={eid}" in out.output and "┏" not in out.output  # no empty result table
    store = open_event_store(None, data_dir=str(dagster_data))
    try:
        events = store.read(eid)
    finally:
        store.close()
    assert events and {(e.tenant_id, e.project_id) for e in events} == {("demo", "examples")}
    assert events[0].data["requested_by"] == "detached:cli"


def test_detach_without_an_event_log_is_a_one_line_error(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    out = CliRunner().invoke(cli, ["run", "--runner", "dagster", "--detach", HELLO],
                             env={"NOETL_DAGSTER_HOME": None, "NOETL_EVENT_STORE_URL": None})  # fmt: skip
    assert out.exit_code == 2
    assert out.output.startswith("error: --detach records the request") and "--data-dir" in out.output
    assert (
        len(out.output.strip().splitlines()) == 1 and not (tmp_path / ".noetl").exists()
    )  # nothing recorded
