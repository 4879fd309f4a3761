"""Issue 14 item 9: a hypothesis fuzz suite over the public commands.

Generators: mutated corpus playbooks (/work/shared/conformance and the example
project), random playbook structures, random workloads and random CLI argument
lists. Every example must end cleanly: no traceback, an exit code in {0, 1, 2},
bounded time; a playbook that validates must run to `completed` or `failed`
(never exit 2, never left `running`); and tests/conftest.py replays every
execution that ran and compares it with the live state.

The example budget is fixed for CI (60 per test; the whole file runs in well under 60 s);
set NOETL_FUZZ_EXAMPLES=500 (per test) for a longer run.
"""

from __future__ import annotations

import json
import os
import random
import time
from pathlib import Path

import pytest
import yaml
from hardening_helpers import HEAD, invoke
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from noetl_dagster.dsl.loader import YamlSyntaxError, load_yaml_text

EXAMPLES = int(os.environ.get("NOETL_FUZZ_EXAMPLES", "60"))
PER_EXAMPLE_S = 20.0
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,  # wall time is asserted per example instead (first runs import modules)
    suppress_health_check=[
        HealthCheck.function_scoped_fixture,
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
    ],
    derandomize=os.environ.get("NOETL_FUZZ_RANDOM") is None,  # CI: the same examples every run
    database=None,
)

ROOT = Path(__file__).resolve().parents[2]
SHARED = Path(os.environ.get("NOETL_SHARED", ROOT.parent / "shared"))
CORPUS = sorted(
    [p for p in (SHARED / "conformance").rglob("*.yaml") if p.stat().st_size < 200_000]
    + list((ROOT / "example_project" / "playbooks").glob("*.yaml"))
)


def _timed(args: list[str], **kw):
    t0 = time.perf_counter()
    r = invoke(args, **kw)
    assert time.perf_counter() - t0 < PER_EXAMPLE_S, f"{args[:3]} took {time.perf_counter() - t0:.1f} s"
    return r


# -- values ------------------------------------------------------------------------------------

EVIL_TEMPLATES = [
    "{{ ctx.update({'a': 1}) }}", "{{ workload.items.append(1) }}", "{{ [1] * 10**9 }}", "{{ 'a' * 10**9 }}",
    "{{ range(10**9) | list }}", "{{ steps }}", "{{ workload | map(attribute='__class__') | list }}",
    "{{ [workload.missing] }}", "{{ workload.missing.deeper[0] }}", "{{ 1 / 0 }}", "{{ x.__class__.__mro__ }}",
    "{{ ", "{% for %}", "{{ start }}", "{{ ctx }}", "{{ workload }}", "{{ 10 ** 100 }}", "{{ (1, 2) }}",
    "{{ {'a': [1, {'b': none}]} }}", "{{ 'x' | center(10**9) }}", "{{ lipsum(10**6) }}", "{{ cycler }}",
    "{{ namespace }}", "{{ self }}", "{{ loop }}", "{{ iter.index }}", "{{ execution_id }}", "{{ 1e308 * 10 }}",
    # issue 29.2: refused before allocation, never a crash of `run`
    "{{ 2 ** 30000 }}", "{{ (['x'*1000000]*2500)|join|length }}", "{{ sum([[0]*1000]*10000, []) }}",
    "a{{ workload|attr('__class__') }}", "{{ ('\t'*1000000).expandtabs(2500) }}", "{{ [workload] * 1000000 }}",
]  # fmt: skip

scalars = st.one_of(
    st.none(), st.booleans(), st.integers(), st.integers(min_value=10**18, max_value=10**40),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=20), st.sampled_from(EVIL_TEMPLATES),
    st.sampled_from(["start", "end", "a", "b", "noop", "python", "retry", "jump", "fail", "exclusive", ".."]),
)  # fmt: skip
json_like = st.recursive(
    scalars,
    lambda kids: st.one_of(
        st.lists(kids, max_size=4), st.dictionaries(st.text(max_size=8), kids, max_size=4)
    ),
    max_leaves=12,
)
json_scalars = st.one_of(st.none(), st.booleans(), st.integers(-(10**30), 10**30), st.floats(allow_nan=False),
                         st.text(max_size=20), st.sampled_from(EVIL_TEMPLATES))  # fmt: skip
workloads = st.dictionaries(
    st.text(max_size=10),
    st.recursive(
        json_scalars,
        lambda k: st.one_of(st.lists(k, max_size=4), st.dictionaries(st.text(max_size=6), k, max_size=4)),
        max_leaves=10,
    ),  # fmt: skip
    max_size=5,
)


# -- 1. mutated corpus files -------------------------------------------------------------------


def _mutate_tree(data, rnd: random.Random, value):
    """Replace one random node of a loaded YAML tree by ``value``."""
    if not isinstance(data, (dict, list)) or not data:
        return value
    holder, key = None, None
    node = data
    for _ in range(rnd.randint(1, 6)):
        if isinstance(node, dict) and node:
            holder, key = node, rnd.choice(list(node))
        elif isinstance(node, list) and node:
            holder, key = node, rnd.randrange(len(node))
        else:
            break
        node = holder[key]
    if holder is not None:
        holder[key] = value
    return data


def _mutate_bytes(raw: bytes, rnd: random.Random, junk: bytes) -> bytes:
    op = rnd.choice(["cut", "dup", "insert", "truncate", "swap"])
    i, j = sorted(rnd.randrange(len(raw) + 1) for _ in range(2))
    if op == "cut":
        return raw[:i] + raw[j:]
    if op == "dup":
        return raw[:j] + raw[i:j] + raw[j:]
    if op == "insert":
        return raw[:i] + junk + raw[i:]
    if op == "truncate":
        return raw[:i]
    return raw[j:] + raw[:i]


@FUZZ
@given(
    index=st.integers(min_value=0, max_value=max(len(CORPUS) - 1, 0)),
    seed=st.integers(0, 2**32),
    structural=st.booleans(),
    value=json_like,
    junk=st.binary(max_size=16)
    | st.sampled_from([b"&a [*a]", b"*x", b"{{", b"\t", b"\xff", b": : :", b"- [[[[", b"<<: *a"]),
)
def test_fuzz_mutated_corpus_validate_and_migrate(tmp_path_factory, index, seed, structural, value, junk):
    assert CORPUS, f"no corpus under {SHARED}"
    src = CORPUS[index]
    rnd = random.Random(seed)
    raw = src.read_bytes()
    if structural:
        try:
            data, _ = load_yaml_text(raw.decode("utf-8"), str(src))
        except (YamlSyntaxError, UnicodeDecodeError):
            data = {}
        try:
            raw = yaml.safe_dump(_mutate_tree(data, rnd, value), allow_unicode=True, sort_keys=False).encode()
        except (yaml.YAMLError, ValueError, TypeError, RecursionError):
            raw = raw[: len(raw) // 2]
    else:
        raw = _mutate_bytes(raw, rnd, junk)
    d = tmp_path_factory.mktemp("corpus")
    f = d / src.name
    f.write_bytes(raw)
    v = _timed(["validate", str(f)])
    event(f"validate exit {v.exit_code}")
    _timed(["migrate", "--check", str(f)])
    if v.exit_code == 0:
        _timed(["validate", "--json", str(f)])


# -- 2. random playbook structures, run for real -----------------------------------------------

STEP_NAMES = ["start", "a", "b", "c", "end"]
WHENS = [None, None, "{{ true }}", "{{ false }}", "{{ ctx.n | default(0) < 3 }}", "{{ outcome.status == 'error' }}",
         "{{ event.name == 'call.done' }}", *EVIL_TEMPLATES[:6]]  # fmt: skip
CODES = ["result = 1", "result = {'n': 2}", "raise ValueError('boom')", "result = [1] * 3",
         # results over the inline limit (stored by reference, read back live or from the store) and
         # results JSON cannot hold (a task error, never a crash)
         "result = ['x' * 100] * 1000", "result = {'t': (1, 2), 'b': 'y' * 70000}",
         "result = []; result.append(result)", "result = {(1, 2): 3}"]  # fmt: skip


@st.composite
def playbooks(draw):
    names = STEP_NAMES[: draw(st.integers(1, len(STEP_NAMES)))]
    steps = []
    for name in names:
        step: dict = {"step": name}
        kind = draw(st.sampled_from(["noop", "python", "pipeline"]))
        if kind == "noop":
            step["tool"] = {
                "kind": "noop",
                "input": {"x": draw(st.sampled_from([*EVIL_TEMPLATES, "plain", 3]))},
            }
        elif kind == "python":
            step["tool"] = {"kind": "python", "code": draw(st.sampled_from(CODES))}
        else:
            then = draw(st.sampled_from([
                {"do": "retry", "attempts": 2, "delay": 0}, {"do": "continue"}, {"do": "fail"}, {"do": "break"},
                {"do": "retry", "attempts": 2, "delay": 0, "backoff": "exponential"}, {"do": "jump", "to": "t2"},
            ]))  # fmt: skip
            step["tool"] = [
                {"t1": {"kind": "python", "code": draw(st.sampled_from(CODES)),
                        "spec": {"policy": {"rules": [{"when": "{{ outcome.status == 'error' }}", "then": then}]}}}},
                {"t2": {"kind": "noop"}},
            ]  # fmt: skip
        if draw(st.booleans()):
            step["loop"] = {"in": draw(st.sampled_from(["{{ workload.items }}", "{{ [1, 2, 3] }}", "{{ range(4) }}", "{{ 5 }}"])),
                            "iterator": "it", "spec": {"mode": draw(st.sampled_from(["sequential", "parallel"]))}}  # fmt: skip
        if draw(st.booleans()):
            step["set"] = {
                "ctx": {
                    "n": draw(
                        st.sampled_from(["{{ ctx.n | default(0) + 1 }}", "{{ 1 }}", *EVIL_TEMPLATES[:4]])
                    )
                }
            }
        arcs = [{"step": draw(st.sampled_from(names))} for _ in range(draw(st.integers(0, 2)))]
        for arc in arcs:
            w = draw(st.sampled_from(WHENS))
            if w is not None:
                arc["when"] = w
        if arcs:
            step["next"] = {"spec": {"mode": draw(st.sampled_from(["exclusive", "inclusive"]))}, "arcs": arcs}
        steps.append(step)
    doc = {"workload": {"items": [1, 2]}, "executor": {"spec": {"max_step_runs": 40}}, "workflow": steps}
    return HEAD + yaml.safe_dump(doc, sort_keys=False)


@FUZZ
@given(text=playbooks(), workload=workloads)
def test_fuzz_random_playbooks_run_and_replay(tmp_path_factory, monkeypatch, text, workload):
    d = tmp_path_factory.mktemp("pb")
    monkeypatch.setenv("NOETL_DAGSTER_HOME", str(d / "home"))
    f = d / "p.yaml"
    f.write_text(text, encoding="utf-8")
    v = _timed(["validate", str(f)])
    event(f"validate exit {v.exit_code}")
    if v.exit_code != 0:
        return
    r = _timed(["run", str(f), "--json", "--workload", json.dumps(workload)])
    assert r.exit_code in (0, 1), f"a valid playbook was refused at run time:\n{text}\n{r.output[-1500:]}"
    out = json.loads(r.output.strip().splitlines()[-1])
    assert out["status"] in ("completed", "failed"), out["status"]
    event(f"run {out['status']}")
    ex = invoke(["executions", "--json"])
    assert all(row["status"] in ("completed", "failed") for row in json.loads(ex.output))


# -- 3. random CLI argument lists --------------------------------------------------------------

ARG_VALUES = [
    "", "-", "--", "x", "../x", "a/b", "a\x00b", "a\x1bb", "\u202e", "99999999999999999999", "-1", "0", "1e308",
    "mysql://u@h/db", "postgresql://nobody@127.0.0.1:1/none", "sqlite:///", "sqlite:////", "file:///nope", "s3://",
    "{PB}", "{BOMB}", "{BIN}", "{DIR}", "{DIR}/missing.yaml", "@{BIN}", "@{DIR}", "{}", "[]", "[" * 5000, '{"a":',
]  # fmt: skip
COMMAND_OPTIONS = {
    "validate": ["--json"],
    "run": [
        "--workload",
        "--json",
        "--event-store",
        "--data-dir",
        "--tenant",
        "--project",
        "--max-step-runs",
        "--catalog",
        "-q",
    ],
    "replay": ["--from-archive", "--event-store", "--data-dir", "--json"],
    "events": ["--event-store", "--data-dir", "--json"],
    "executions": ["--event-store", "--data-dir", "--limit", "--json"],
    "migrate": ["-o", "--check", "--in-place", "-v"],
    "archive": ["--to", "--event-store", "--data-dir"],
    "resume": ["--event-store", "--data-dir"],
}
REGISTRY = {
    ("migrate",): ["--db"],
    ("keys", "list"): ["--db", "--tenant"],
    ("keys", "create"): ["--db", "--tenant", "--project", "--label"],
    ("keys", "revoke"): ["--db"],
    ("serve",): ["--port"],  # always with a bad port below (a good one would serve for ever)
}


def _fill(token: str, paths: dict[str, str]) -> str:
    for k, v in paths.items():
        token = token.replace("{" + k + "}", v)
    return token


@pytest.fixture
def fuzz_files(tmp_path_factory):
    d = tmp_path_factory.mktemp("cli")
    (d / "pb.yaml").write_text(HEAD + "workflow:\n  - step: start\n    tool: {kind: noop}\n")
    (d / "bomb.yaml").write_text("a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join(['*' + chr(97 + i)] * 10)}]\n" for i in range(8)))  # fmt: skip
    (d / "bin.yaml").write_bytes(b"\x00\xff\xfe binary")
    return {"PB": str(d / "pb.yaml"), "BOMB": str(d / "bomb.yaml"), "BIN": str(d / "bin.yaml"), "DIR": str(d)}


@FUZZ
@given(
    command=st.sampled_from(sorted(COMMAND_OPTIONS)),
    positional=st.lists(
        st.sampled_from(["{PB}", "{PB}", "{BOMB}", "{BIN}", *ARG_VALUES]), min_size=1, max_size=2
    ),
    options=st.lists(st.tuples(st.integers(0, 20), st.sampled_from(ARG_VALUES)), max_size=4),
)
def test_fuzz_cli_arguments(fuzz_files, monkeypatch, command, positional, options):
    monkeypatch.setenv("NOETL_DAGSTER_HOME", fuzz_files["DIR"] + "/home")
    monkeypatch.chdir(fuzz_files["DIR"])
    opts = COMMAND_OPTIONS[command]
    args = [command, *(_fill(p, fuzz_files) for p in positional)]
    for i, value in options:
        opt = opts[i % len(opts)]
        args.append(opt)
        if opt not in ("--json", "-q", "--check", "--in-place", "-v"):
            args.append(_fill(value, fuzz_files))
    if command == "run":
        args += ["--max-step-runs", "20"]
    event(f"exit {_timed(args).exit_code}")


@FUZZ
@given(
    command=st.sampled_from(sorted(REGISTRY)),
    options=st.lists(
        st.tuples(st.integers(0, 20), st.sampled_from([*ARG_VALUES, "sqlite:///{DIR}/r.db", "acme"])),
        max_size=4,
    ),
    key_id=st.sampled_from(["x", "nrk_x", "", "\x00", "a" * 5000]),
)
def test_fuzz_registry_cli_arguments(fuzz_files, monkeypatch, command, options, key_id):
    monkeypatch.setenv("NOETL_DAGSTER_HOME", fuzz_files["DIR"] + "/home")
    monkeypatch.chdir(fuzz_files["DIR"])  # a relative --db names a file: never in the checkout
    opts = REGISTRY[command]
    args = list(command)
    if command == ("keys", "revoke"):
        args.append(key_id)
    for i, value in options:
        args += [opts[i % len(opts)], _fill(value, fuzz_files)]
    if command == ("serve",):
        args += ["--port", "99999"]
    _timed(args, registry=True)


# -- 4. fan-out arcs against the step-run cap (issue 29 item 4) --------------------------------

FAN_WHENS = [None, None, "{{ true }}", "{{ outcome.status == 'ok' }}", "{{ ctx.n | default(0) < 3 }}",
             "{{ args.i | default(0) < 2 }}", "{{ false }}"]  # fmt: skip


@st.composite
def fan_out_playbooks(draw):
    """Steps with many inclusive arcs (self-arcs, back-arcs, args, guards), a small cap: the cap must hold."""
    names = STEP_NAMES[: draw(st.integers(1, 3))]
    cap = draw(st.integers(1, 60))
    steps = []
    for name in names:
        step: dict = {"step": name, "tool": {"kind": "noop"}}
        if draw(st.integers(0, 4)) == 0:
            step["loop"] = {"in": "{{ [1, 2] }}", "iterator": "it"}
        if draw(st.booleans()):
            step["set"] = {"ctx": {"n": "{{ ctx.n | default(0) + 1 }}"}}
        arcs = []
        for i in range(draw(st.integers(0, 12))):
            arc: dict = {"step": draw(st.sampled_from(names))}
            w = draw(st.sampled_from(FAN_WHENS))
            if w is not None:
                arc["when"] = w
            if draw(st.booleans()):
                arc["args"] = {"i": i}
            arcs.append(arc)
        if arcs:
            step["next"] = {
                "spec": {"mode": draw(st.sampled_from(["inclusive", "inclusive", "exclusive"]))},
                "arcs": arcs,
            }
        steps.append(step)
    doc = {"executor": {"spec": {"max_step_runs": cap}}, "workflow": steps}
    return cap, HEAD + yaml.safe_dump(doc, sort_keys=False)


@FUZZ
@given(case=fan_out_playbooks())
def test_fuzz_fan_out_arcs_hold_the_step_run_cap(tmp_path_factory, monkeypatch, case):
    cap, text = case
    d = tmp_path_factory.mktemp("fan")
    home = d / "home"
    monkeypatch.setenv("NOETL_DAGSTER_HOME", str(home))
    f = d / "p.yaml"
    f.write_text(text, encoding="utf-8")
    if _timed(["validate", str(f)]).exit_code != 0:
        event("validate refused")
        return
    r = _timed(["run", str(f), "--json"])
    assert r.exit_code in (0, 1), r.output[-1500:]
    out = json.loads(r.output.strip().splitlines()[0])
    total = sum(out["runs"].values())
    capped = [s for s, v in out["results"].items()
              if isinstance(v, dict) and (v.get("error") or {}).get("kind") == "max_step_runs"]  # fmt: skip
    if capped:  # the cap, and exactly one refused run that carries the error
        assert out["status"] == "failed" and total == cap + 1 and len(capped) == 1, (cap, out["runs"])
    else:
        assert total <= cap, (cap, out["runs"])
    from noetl_dagster.storage.event_stores import open_event_store

    store = open_event_store(None, data_dir=home)
    try:
        evs = store.read(out["execution_id"])
    finally:
        store.close()
    assert sum(e.name == "step.scheduled" for e in evs) == total
    assert [e.name for e in evs][-2:] == ["workflow.finished", "playbook.processed"]
    event(f"run {out['status']}{' at the cap' if capped else ''}")
    # tests/conftest.py replays the execution and compares it with the live state
