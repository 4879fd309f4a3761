"""The playbook builder: same model as YAML, errors at the builder call, identity, docs/builder.md."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from noetl_dagster.dsl import load_playbook_dict
from noetl_dagster.dsl.builder import (
    BuilderInvalid,
    arc,
    canonical_yaml,
    noop,
    playbook,
    playbook_id,
    python,
    route,
    subplaybook,
    tool,
    when,
)
from noetl_dagster.dsl.parse import PlaybookInvalid
from noetl_dagster.runners.local import run_playbook

DOCS = Path(__file__).resolve().parents[2] / "docs" / "builder.md"
HERE = __file__


def _line_of(marker: str) -> int:
    for n, text in enumerate(Path(HERE).read_text().splitlines(), 1):
        if marker in text and "_line_of" not in text:
            return n
    raise AssertionError(marker)


def test_docs_yaml_and_builder_code_are_the_same_playbook():
    text = DOCS.read_text()
    yaml_block = re.search(r"```yaml\n(apiVersion.*?)```", text, re.S).group(1)
    code_block = re.search(r"```python\n(from noetl_dagster.dsl.builder.*?)```", text, re.S).group(1)
    ns: dict = {}
    exec(compile(code_block, str(DOCS), "exec"), ns)  # noqa: S102 - the documented example itself
    built = ns["pb"].build()
    from_yaml = load_playbook_dict(yaml.safe_load(yaml_block))
    assert built == from_yaml
    assert playbook_id(built) == playbook_id(from_yaml)
    assert load_playbook_dict(yaml.safe_load(ns["pb"].to_yaml())) == built


def test_issues_point_at_the_builder_call_that_caused_them():
    b = (
        playbook("bad", path="t/bad")
        .step("start", next=["missing"])  # MARK-arc
        .step("work", tool=tool("no_such_kind"))  # MARK-kind
        .step("jumpy", tool=noop(policy=[when("{{ true }}", "jump", to="nowhere")]))  # MARK-jump
        .step("looped", tool=noop(), loop=None, next=[arc("start", when="{{ broken")])  # MARK-template
        .step("empty")  # MARK-empty
    )
    with pytest.raises(BuilderInvalid) as ei:
        b.build()
    assert isinstance(ei.value, PlaybookInvalid)
    got = {(i.rule, i.file, i.line) for i in ei.value.issues}
    assert ("unknown-arc-target", HERE, _line_of("MARK-arc")) in got
    assert ("unknown-tool-kind", HERE, _line_of("MARK-kind")) in got
    assert ("policy-jump", HERE, _line_of("MARK-jump")) in got
    assert ("template-syntax", HERE, _line_of("MARK-template")) in got
    assert ("step-tool-or-next", HERE, _line_of("MARK-empty")) in got
    assert f"{HERE}:{_line_of('MARK-arc')}: unknown-arc-target" in str(ei.value)


def test_an_element_made_apart_from_the_step_points_at_where_it_was_made():
    rule = when("{{ true }}", "retry", backoff="sideways")  # MARK-rule
    b = playbook("p").step("a", tool=python("result = 1", policy=[rule]))
    with pytest.raises(BuilderInvalid) as ei:
        b.build()
    (issue,) = [i for i in ei.value.issues if i.rule == "policy-backoff"]
    assert (issue.file, issue.line) == (HERE, _line_of("MARK-rule"))
    dup = playbook("d").step("a", tool=noop()).step("a", tool=noop())  # MARK-dup
    with pytest.raises(BuilderInvalid) as ei:
        dup.build()
    assert [(i.rule, i.line) for i in ei.value.issues] == [("duplicate-step", _line_of("MARK-dup"))]


def test_wrong_python_types_fail_at_the_call():
    with pytest.raises(TypeError):
        playbook("p").step("a", tool="python")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        subplaybook("a/b", definition={"kind": "Playbook"})
    with pytest.raises(TypeError):
        subplaybook()


def test_identity_ignores_layout_and_key_order():
    b = playbook("same", path="x/same").workload(b=2, a=1).step("s", tool=noop({"k": 1, "j": 2}))
    m = b.build()
    raw = yaml.safe_load(b.to_yaml())
    shuffled = {k: raw[k] for k in reversed(list(raw))}
    shuffled["workload"] = {"a": 1, "b": 2}
    m2 = load_playbook_dict(shuffled)
    assert playbook_id(m2) == playbook_id(m) and playbook_id(m).startswith("sha256:")
    assert canonical_yaml(m2) == canonical_yaml(m)
    changed = (
        playbook("same", path="x/same").workload(a=1, b=3).step("s", tool=noop({"k": 1, "j": 2})).build()
    )
    assert playbook_id(changed) != playbook_id(m)


def test_a_built_playbook_runs_like_its_yaml(tmp_path):
    b = (
        playbook("counter", path="t/counter")
        .workload(limit=3)
        .step("start", tool=python("result = {'n': 0}", label="init"), set={"ctx.n": 0}, next=["inc"])
        .step(
            "inc",
            tool=python("def main(n):\n    return {'n': n + 1}\n", input={"n": "{{ ctx.n }}"}),
            set={"ctx.n": "{{ inc.n }}"},
            next=route(
                arc("inc", when="{{ ctx.n < workload.limit }}"),
                arc("done", when="{{ ctx.n >= workload.limit }}"),
            ),
        )
        .step("done", tool=noop({"final": "{{ ctx.n }}"}))
    )
    home = tmp_path / "home"
    built = run_playbook(b.build(), event_store=f"sqlite:///{tmp_path / 'a.db'}", data_dir=home)
    path = tmp_path / "counter.yaml"
    path.write_text(b.to_yaml())
    from_file = run_playbook(path, event_store=f"sqlite:///{tmp_path / 'b.db'}", data_dir=home)
    assert built.status == from_file.status == "completed"
    assert built.ctx == from_file.ctx == {"n": 3}
    assert built.runs == from_file.runs
