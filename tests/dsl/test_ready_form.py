"""The ready-to-run form of a cached playbook (dsl/ready.py, issue 35) behaves as the pydantic model.

``noetl-dagster run`` of an unchanged file hands the local runner pydantic-free twins of the
``dsl.model`` classes, unpickled from the parse-cache entry. One engine, one semantics: every
example playbook and every conformance core fixture runs through the cache-hit path (the twins)
and through the validated path (the model) with the same summary and the same event names per step;
the twins' field lists are the models'; the model's answers (``model_dump``, ``model_copy``,
``==``, copy, pickle, assignment) are the twins' too.
"""

from __future__ import annotations

import copy
import json
import pickle
import random
import re
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from noetl_dagster.conformance.corpus import FixtureSetup, fixture_setups
from noetl_dagster.conformance.runner import (
    DEFAULT_PG_URL,
    PostgresTarget,
    fixture_workload,
    read_core_list,
)
from noetl_dagster.conformance.stubs import StubSet
from noetl_dagster.dsl import model, ready, shapes
from noetl_dagster.dsl.cache import load_playbook, load_playbook_cached
from noetl_dagster.runners.local import run_playbook
from noetl_dagster.storage.event_stores import open_event_store
from tests.conftest import CONFORMANCE

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "example_project" / "playbooks").glob("*.yaml"))
CORE = read_core_list(CONFORMANCE.parents[1] / "core_fixtures.txt", CONFORMANCE)
VOLATILE = {"execution_id", "date", "resource_id", "location"}  # as tests/dagster/dagster_helpers.py
# what two runs of one playbook differ in by nature, whatever its form: clocks, ids, the data dir
CLOCK_KEYS = re.compile(r"(^|_)(ms|seconds|duration|elapsed|took|timestamp|time|per_second)$|_at$")
CLOCK_TEXT = re.compile(
    r"\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d(\.\d+)?([+-]\d\d:?\d\d|Z)?"
    r"|[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"
)


def _ready(pb: model.Playbook) -> Any:
    return ready.load_ready(pickle.dumps(pb, protocol=pickle.HIGHEST_PROTOCOL))


def _strip(value: Any, data_dir: str) -> Any:
    if isinstance(value, dict):
        return {
            k: "<clock>" if CLOCK_KEYS.search(str(k)) else _strip(v, data_dir)
            for k, v in value.items()
            if str(k).lower() not in VOLATILE
        }
    if isinstance(value, list):
        return [_strip(v, data_dir) for v in value]
    if isinstance(value, str):
        return CLOCK_TEXT.sub("<clock>", value.replace(data_dir, "<data>"))
    return value


def _trace(result: Any, data_dir: Path) -> tuple[dict, dict]:
    """(summary without clocks and ids, event names per (step, iteration)) of one execution."""
    j = result.to_json()
    store = open_event_store(None, data_dir=data_dir)
    try:
        events = store.read(result.execution_id)
    finally:
        store.close()
    names: dict[tuple, list[str]] = defaultdict(list)
    for ev in events:
        names[(ev.step, ev.iteration)].append(ev.name)
    return _strip(j, str(data_dir)), dict(names)


def test_every_model_a_playbook_holds_has_a_twin_with_its_fields():
    reachable, todo = set(), [model.Playbook]
    while todo:  # the model classes a Playbook's fields can hold, transitively
        cls = todo.pop()
        if cls.__name__ in reachable:
            continue
        reachable.add(cls.__name__)
        for f in cls.model_fields.values():
            todo += [
                t for t in _types(f.annotation) if isinstance(t, type) and issubclass(t, model.BaseModel)
            ]
    assert reachable == set(ready.TWINS)
    for name, twin in ready.TWINS.items():
        m = getattr(model, name)
        assert twin._fields == set(m.model_fields), name
        assert twin._private == set(m.__private_attributes__), name
        assert twin._extra == (m.model_config.get("extra") == "allow"), name
        shared = [b for b in m.__mro__ if b.__module__ == shapes.__name__]  # the behaviour both inherit
        assert [b for b in twin.__mro__[1:] if b not in (ready.ReadyModel, object)] == shared, name


def _types(annotation: Any) -> list[Any]:
    args = getattr(annotation, "__args__", None)
    return [annotation] if not args else [t for a in args for t in _types(a)]


CURSOR_LOOPS = [  # the corpus's loop.cursor fixtures (frame_policy, answered by the model)
    "batch_execution/frame_heartbeat_regression/frame_heartbeat_regression.yaml",
    "pft_flow_test/test_pft_flow_v2.yaml",
]
PLAYBOOKS = [*EXAMPLES, *(CONFORMANCE / rel for rel in [*CORE, *CURSOR_LOOPS])]


def _pid(p: Path) -> str:
    return str(p.relative_to(CONFORMANCE) if p.is_relative_to(CONFORMANCE) else p.name)


@pytest.mark.parametrize("path", PLAYBOOKS, ids=_pid)
def test_the_twins_hold_the_models_state(path):
    pb = load_playbook(path)
    twin = _ready(pb)
    assert type(twin) is ready.Playbook and isinstance(twin, shapes.PlaybookBase)
    assert twin.as_model() == pb and twin == _ready(pb)
    for kw in ({}, {"mode": "json"}, {"by_alias": True, "exclude_none": True, "exclude_defaults": True}):
        assert twin.model_dump(**kw) == pb.model_dump(**kw)
    assert repr(twin) == repr(pb)
    assert (
        pickle.loads(pickle.dumps(twin)) == twin and type(pickle.loads(pickle.dumps(twin))) is ready.Playbook
    )
    assert copy.deepcopy(twin) == twin and copy.copy(twin) == twin
    assert twin.steps.keys() == pb.steps.keys() and twin.entry_step == pb.entry_step and twin.name == pb.name
    assert twin.base_dir == pb.base_dir and twin.dagster == pb.dagster
    cursors: list[Any] = []
    for ts, ms in zip(twin.workflow, pb.workflow, strict=True):
        assert ts.targets == ms.targets and bool(ts.set) == bool(ms.set) and list(ts) == list(ms)
        for tl, ml in (
            (ts.loop, ms.loop),
            *((t.loop, m.loop) for t, m in zip(ts.tool, ms.tool, strict=True)),
        ):
            if ml is not None and ml.mode == "cursor":
                assert tl.frame_policy == ml.frame_policy
                cursors.append(ml)
        for to, mo in zip(ts.outputs, ms.outputs, strict=True):
            assert [c.kind for c in to.checks] == [c.kind for c in mo.checks]
    assert cursors or _pid(path) not in CURSOR_LOOPS


def test_model_copy_and_assignment_follow_the_model():
    pb = load_playbook(EXAMPLES[0])
    twin = _ready(pb)
    update = {"spec": {**pb.executor.spec, "max_step_runs": 7}, "extra_key": 1}
    t_copy, m_copy = twin.executor.model_copy(update=update), pb.executor.model_copy(update=update)
    assert type(t_copy) is ready.Executor and t_copy.as_model() == m_copy
    assert t_copy.model_fields_set == m_copy.model_fields_set and t_copy.extra_key == m_copy.extra_key == 1
    assert twin.executor.spec.get("max_step_runs") != 7  # the original untouched
    deep = twin.model_copy(deep=True)
    assert deep == twin and deep.workflow[0] is not twin.workflow[0]
    step, m_step = twin.workflow[0], pb.workflow[0]
    with pytest.raises(ValueError, match="object has no field") as t_err:
        step.no_such_field = 1
    with pytest.raises(ValueError, match="object has no field") as m_err:
        m_step.no_such_field = 1
    assert str(t_err.value) == str(m_err.value)
    step.desc, m_step.desc = "changed", "changed"
    twin.metadata.owner, pb.metadata.owner = "me", "me"  # extra allowed
    assert twin.as_model() == pb and twin.metadata.model_extra == {"owner": "me"}
    assert step.model_fields_set == m_step.model_fields_set


def test_a_cache_hit_answers_the_ready_form_and_a_miss_the_model(tmp_path, monkeypatch):
    monkeypatch.setenv("NOETL_DAGSTER_PLAYBOOK_CACHE", str(tmp_path / "cache"))
    path = EXAMPLES[0]
    first = load_playbook_cached(path, ready=True)
    assert type(first) is model.Playbook  # a miss: parsed and validated
    hit = load_playbook_cached(path, ready=True)
    assert type(hit) is ready.Playbook and hit.as_model() == first
    assert type(load_playbook_cached(path)) is model.Playbook  # the code location's form


def _both_forms(path: Path, tmp_path: Path, run: Any) -> None:
    pb = load_playbook(path)
    traces = []
    for form, playbook in (("model", pb), ("ready", _ready(pb))):
        data_dir = tmp_path / form
        random.seed(35)  # fixtures that draw random numbers in python tasks draw the same ones
        traces.append(_trace(run(playbook, data_dir), data_dir))
    (m_summary, m_names), (r_summary, r_names) = traces
    assert r_summary == m_summary
    assert r_names == m_names


def _scope(path: Path) -> dict[str, str]:  # the example project's tables live in its tenant/project
    return {"tenant": "demo", "project": "examples"}


@pytest.mark.parametrize("path", EXAMPLES, ids=_pid)
def test_an_example_runs_alike_from_the_ready_form_and_the_model(path, tmp_path):
    _both_forms(path, tmp_path, lambda pb, d: run_playbook(pb, data_dir=d, **_scope(path)))


@pytest.fixture(scope="module")
def stubs():
    with StubSet() as s:
        yield s


@pytest.fixture(scope="module")
def pg(tmp_path_factory):
    target = PostgresTarget(DEFAULT_PG_URL)
    target.ensure_database()
    creds = tmp_path_factory.mktemp("creds") / "credentials.json"
    creds.write_text(json.dumps(target.credentials()))
    return target, creds


# a core fixture whose outcome is thread timing: it fails itself unless the stub saw two requests in
# flight at once (max_active >= 2), which a loaded machine does not always give, in either form
TIMING_DEPENDENT = {"pagination/basic/test_pagination_basic.yaml"}


@pytest.mark.parametrize("rel", [r for r in CORE if r not in TIMING_DEPENDENT])
def test_a_core_fixture_runs_alike_from_the_ready_form_and_the_model(rel, stubs, pg, tmp_path, monkeypatch):
    target, creds = pg
    monkeypatch.setenv("NOETL_HTTP_OVERRIDES", json.dumps(stubs.overrides))
    monkeypatch.setenv("NOETL_CREDENTIALS_FILE", str(creds))
    path = CONFORMANCE / rel
    setup = fixture_setups(target.params).get(rel, FixtureSetup())
    workload = fixture_workload(path, setup, stubs.overrides)

    def run(pb: Any, data_dir: Path) -> Any:
        if setup.seeds:  # each form starts from the same tables
            target.run_sql(setup.seeds)
        api = stubs["paginated-api"]  # and the same stub state (failed-once pages, the rate window)
        with api.state_lock:
            api.flaky_attempts.clear()
            api.rate_last.clear()
        return run_playbook(pb, workload, data_dir=data_dir, catalog_dirs=[CONFORMANCE])

    _both_forms(path, tmp_path, run)
