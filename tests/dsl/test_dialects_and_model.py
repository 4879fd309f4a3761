"""SEMANTICS §1: the standard form and the runtime dialect normalize to one
canonical model; a playbook built in Python validates (check_playbook) and runs the
same; the model round-trips to a standard-form document."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from noetl_dagster.dsl import (
    Arc,
    Loop,
    Metadata,
    Playbook,
    PlaybookInvalid,
    PolicyRule,
    Router,
    RuleThen,
    SetBlock,
    Step,
    Task,
    YamlSyntaxError,
    check_playbook,
    load_playbook,
    load_playbook_dict,
    load_yaml_file,
    load_yaml_text,
    parse_playbook,
    playbook_to_raw,
    validate_file,
)
from noetl_dagster.runners.local import run_playbook

STANDARD = """
apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: d, path: tests/d}
workload: {n: 2}
workflow:
  - step: start
    loop:
      in: "{{ [1, 2] }}"
      iterator: k
      spec: {mode: sequential}
    tool:
      - fetch:
          kind: python
          input: {n: "{{ workload.n }}", k: "{{ iter.k }}"}
          code: "result = {'v': n * k}"
          spec:
            timeout: 5
            policy:
              rules:
                - when: "{{ outcome.status == 'error' }}"
                  then: {do: retry, attempts: 2, backoff: fixed, delay: 0}
                - else:
                    then:
                      do: continue
                      set_iter: {w: "{{ outcome.result.v }}"}
      - keep:
          kind: noop
          result: "{{ iter.w }}"
    set: {ctx.total: "{{ start.results | sum }}"}
    next:
      spec: {mode: exclusive}
      arcs:
        - step: end
          args: {total: "{{ ctx.total }}"}
          set: {ctx.routed: true}
  - step: end
    tool:
      - task_0:
          kind: noop
          result: "{{ args.total }}"
"""

RUNTIME = """
apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: d, path: tests/d}
workload: {n: 2}
workflow:
  - step: start
    loop:
      in: "{{ [1, 2] }}"
      iterator: k
      spec: {mode: sequential}
    tool:
      - name: fetch
        kind: python
        input: {n: "{{ workload.n }}", k: "{{ iter.k }}"}
        spec:
          code: "result = {'v': n * k}"
          timeout: 5
          policy:
            rules:
              - when: "{{ outcome.status == 'error' }}"
                then: {do: retry, attempts: 2, backoff: fixed, delay: 0}
              - else:
                  do: continue
                  set: {iter.w: "{{ outcome.result.v }}"}
      - name: keep
        kind: noop
        result: "{{ iter.w }}"
    set: {ctx.total: "{{ start.results | sum }}"}
    next:
      spec: {mode: exclusive}
      arcs:
        - step: end
          args: {total: "{{ ctx.total }}"}
          set: {ctx.routed: true}
  - step: end
    tool:
      kind: noop
      result: "{{ args.total }}"
"""


def _load(text: str) -> Playbook:
    raw, sm = load_yaml_text(textwrap.dedent(text))
    return load_playbook_dict(raw, source_map=sm)


def _canonical(pb: Playbook) -> dict:
    d = pb.model_dump(exclude={"source_file"})
    for s in d["workflow"]:
        s.pop("line")
    return d


def test_both_dialects_normalize_to_the_same_model():
    std, rt = _load(STANDARD), _load(RUNTIME)
    assert _canonical(std) == _canonical(rt)
    fetch = std.step("start").tool[0]
    assert fetch.label == "fetch" and fetch.kind == "python"
    assert fetch.config["code"] == "result = {'v': n * k}"
    assert fetch.spec == {"timeout": 5}
    assert [r.then.do for r in fetch.policy] == ["retry", "continue"]
    assert fetch.policy[1].is_else and fetch.policy[1].then.set.iter == {"w": "{{ outcome.result.v }}"}
    assert std.step("end").tool[0].label == "task_0"


def test_both_dialects_run_the_same(data_dir, tmp_path):
    out = []
    for name, text in (("std", STANDARD), ("rt", RUNTIME)):
        p = tmp_path / f"{name}.yaml"
        p.write_text(text)
        r = run_playbook(p)
        out.append((r.status, r.ctx, r.results, r.runs))
    assert out[0] == out[1]
    assert out[0][1] == {"total": 6, "routed": True}
    assert out[0][2]["end"] == 6


def test_runtime_dialect_forms():
    pb = _load(
        """
        apiVersion: noetl.io/v2
        kind: Playbook
        metadata: {name: d, path: tests/d}
        workflow:
          - step: start
            tool:
              kind: http
              spec: {url: "http://x", method: GET, timeout: 3}
              set: {ctx.a: 1, step.b: 2, iter.c: 3, bare: 4}
              spec_policy_placeholder: 1
            next:
              arcs: [{step: start, set: {ctx.d: 5}}]
        """.replace("              spec_policy_placeholder: 1\n", "")
    )
    (t,) = pb.step("start").tool
    assert t.label == "task_0"
    assert t.config == {"url": "http://x", "method": "GET"}  # tool keys under spec become inputs
    assert t.spec == {"timeout": 3}
    assert t.set.ctx == {"a": 1, "b": 2, "bare": 4} and t.set.iter == {"c": 3}
    assert pb.step("start").next.arcs[0].set.ctx == {"d": 5}


def test_else_shorthands_are_equal():
    base = """
        apiVersion: noetl.io/v2
        kind: Playbook
        metadata: {name: d, path: tests/d}
        workflow:
          - step: start
            tool:
              - t:
                  kind: noop
                  spec:
                    policy:
                      rules:
                        ELSE
        """
    a = _load(base.replace("ELSE", "- else: {then: {do: break}}"))
    b = _load(base.replace("ELSE", "- else: {do: break}"))
    assert _canonical(a) == _canonical(b)
    assert a.step("start").tool[0].policy[0].then.do == "break"


def test_entry_step_and_defaults():
    pb = _load(STANDARD)
    assert pb.entry_step == "start"
    assert pb.step("start").next.mode == "exclusive"
    assert pb.step("start").loop.mode == "sequential" and pb.step("start").loop.max_in_flight is None
    lines = textwrap.dedent(STANDARD).splitlines()
    assert pb.step("start").line == lines.index("  - step: start") + 1
    assert pb.step("end").line == lines.index("  - step: end") + 1


# -- programmatic construction --------------------------------------------------


def _programmatic() -> Playbook:
    return Playbook(
        metadata=Metadata(name="d", path="tests/d"),
        workload={"n": 2},
        workflow=[
            Step(
                name="start",
                loop=Loop(**{"in": "{{ [1, 2] }}"}, iterator="k"),
                tool=[
                    Task(
                        label="fetch",
                        kind="python",
                        config={
                            "input": {"n": "{{ workload.n }}", "k": "{{ iter.k }}"},
                            "code": "result = {'v': n * k}",
                        },
                        spec={"timeout": 5},
                        policy=[
                            PolicyRule(
                                when="{{ outcome.status == 'error' }}",
                                then=RuleThen(do="retry", attempts=2, backoff="fixed", delay=0),
                            ),
                            PolicyRule(
                                when=None,
                                then=RuleThen(
                                    do="continue", set=SetBlock(iter={"w": "{{ outcome.result.v }}"})
                                ),
                            ),
                        ],  # fmt: skip
                    ),
                    Task(label="keep", kind="noop", config={"result": "{{ iter.w }}"}),
                ],
                set=SetBlock(ctx={"total": "{{ start.results | sum }}"}),
                next=Router(
                    arcs=[
                        Arc(step="end", args={"total": "{{ ctx.total }}"}, set=SetBlock(ctx={"routed": True}))
                    ]
                ),
            ),
            Step(name="end", tool=[Task(label="task_0", kind="noop", config={"result": "{{ args.total }}"})]),
        ],
    )


def test_programmatic_playbook_checks_and_equals_the_yaml_model():
    pb = _programmatic()
    assert check_playbook(pb) is pb
    assert _canonical(pb) == _canonical(_load(STANDARD))


def test_programmatic_playbook_runs_the_same(data_dir, tmp_path):
    p = tmp_path / "std.yaml"
    p.write_text(STANDARD)
    a, b = run_playbook(_programmatic()), run_playbook(p)
    assert (a.status, a.ctx, a.results, a.runs) == (b.status, b.ctx, b.results, b.runs)


def test_programmatic_round_trip_through_a_document(tmp_path):
    import yaml

    raw = playbook_to_raw(_programmatic())
    p = tmp_path / "rt.yaml"
    p.write_text(yaml.safe_dump(raw, sort_keys=False))
    assert validate_file(p) == []
    assert _canonical(load_playbook(p)) == _canonical(_programmatic())


@pytest.mark.parametrize(
    ("mutate", "rule"),
    [
        (lambda pb: pb.workflow[0].next.arcs.append(Arc(step="ghost")), "unknown-arc-target"),
        (lambda pb: pb.workflow[1].tool.append(Task(label="x", kind="teleport")), "unknown-tool-kind"),
        (
            lambda pb: pb.workflow.append(Step(name="end", tool=[Task(label="y", kind="noop")])),
            "duplicate-step",
        ),
        (lambda pb: pb.workflow.append(Step(name="idle")), "step-tool-or-next"),
        (
            lambda pb: pb.workflow[0].tool[0].policy.append(PolicyRule(when="{{ x", then=RuleThen())),
            "template-syntax",
        ),
        (lambda pb: pb.workflow[0].tool.append(Task(label="fetch", kind="noop")), "duplicate-task"),
        (
            lambda pb: (
                setattr(pb.workflow[0].tool[0].policy[0].then, "to", None)
                or setattr(pb.workflow[0].tool[0].policy[0].then, "do", "jump")
            ),
            "policy-jump",
        ),
    ],
)
def test_programmatic_playbook_check_reports_rules(mutate, rule):
    pb = _programmatic()
    mutate(pb)
    pb._steps = None
    with pytest.raises(PlaybookInvalid) as e:
        check_playbook(pb)
    assert rule in {i.rule for i in e.value.issues}, [str(i) for i in e.value.issues]


def test_running_an_invalid_programmatic_playbook_is_refused(data_dir):
    pb = _programmatic()
    pb.workflow[0].next.arcs[0] = Arc(step="ghost")
    with pytest.raises(PlaybookInvalid) as e:
        run_playbook(pb)
    assert e.value.issues[0].rule == "unknown-arc-target"


def test_every_runnable_fixture_round_trips(conformance_dir: Path):
    """playbook_to_raw of any valid fixture parses back to the same model (check_playbook relies on it)."""
    checked = 0
    for f in sorted(conformance_dir.rglob("*.yaml")):
        try:
            raw, sm = load_yaml_file(f)
        except YamlSyntaxError:
            continue
        pb, issues = parse_playbook(raw, source_map=sm, source_file=str(f))
        if pb is None:
            continue
        back, issues = parse_playbook(playbook_to_raw(pb), source_file=pb.source_file)
        assert not issues, (f, [str(i) for i in issues])
        assert _canonical(back) == _canonical(pb), f
        checked += 1
    assert checked >= 50
