"""Both runners on the nats:// event store (issue 45 item 1): the Dagster runner (one run per execution,
and per-step jobs routed by the sensor, which tails the projection through the EventStore port) gives
the local runner's summary and the SQLite store's event names per step. A projector thread keeps the
warm tier while Dagster runs, as the projector process does in a deployment."""

from __future__ import annotations

import threading

import pytest
from dagster_helpers import EXAMPLES, names_per_step, run_dagster, summary
from nats_tier_fixtures import new_tier

from noetl_dagster.engine.replay import replay
from noetl_dagster.runners.local import run_playbook
from noetl_dagster.storage.event_stores import open_event_store
from noetl_dagster.storage.nats_consumers import Projector

PLAYBOOKS = ["hello_dagster", "fanout_join", "countdown_cycle", "score_customer"]


@pytest.fixture(scope="module")
def tiers():
    made = []
    yield made
    for t in made:
        t.cleanup()


@pytest.fixture
def nats_store(tmp_path, monkeypatch, tiers):
    tier = new_tier(tmp_path)
    tiers.append(tier)
    monkeypatch.setenv("NOETL_EVENT_STORE_URL", tier.url)
    stop = threading.Event()
    proj = Projector(tier.url, [tier.placement("demo", "examples"), tier.placement()])
    thread = threading.Thread(target=proj.run, args=(stop.is_set,), daemon=True)
    thread.start()
    yield tier
    stop.set()
    thread.join(10)
    proj.close()


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["default", "per_step"])
@pytest.mark.parametrize("name", PLAYBOOKS)
def test_dagster_runner_on_nats_matches_the_local_runner_on_sqlite(name, mode, nats_store, tmp_path,
                                                                   ephemeral_instance, dagster_data):  # fmt: skip
    path = EXAMPLES / f"{name}.yaml"
    local_dir = tmp_path / "local"
    local = run_playbook(path, data_dir=local_dir, event_store=f"sqlite:///{local_dir}/events.db",
                         tenant="demo", project="examples")  # fmt: skip
    dag = run_dagster(path, dagster_data, ephemeral_instance, mode)
    assert dag.status == local.status == "completed"
    assert summary(dag) == summary(local)
    with open_event_store(f"sqlite:///{local_dir}/events.db") as s:
        expected = names_per_step(s.read(local.execution_id))
    with open_event_store(nats_store.url) as store:
        actual = names_per_step(store.read(dag.execution_id))
        assert actual == expected
        assert replay(store, dag.execution_id).status == dag.status
