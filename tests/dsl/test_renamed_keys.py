"""NoETL's renamed keys (issue 17.1): the old spellings run exactly like the new ones, validate warns
(never errors) for each, and ``migrate`` rewrites old to new."""

from __future__ import annotations

import json
import subprocess
import sys

from noetl_dagster.dsl import load_playbook_dict
from noetl_dagster.dsl.legacy import find_deprecated_spellings
from noetl_dagster.dsl.migrate import migrate_text
from noetl_dagster.runners.local import run_playbook

OLD = """\
apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: renamed, path: tests/renamed}
workload: {n: 2}
workflow:
  - step: start
    args: {base: 10}
    set_ctx: {started: true}
    tool:
      - first:
          kind: python
          args: {k: 3}
          code: |
            result = {"v": k + base}
          output: {store: {kind: object}}
          spec:
            policy:
              rules:
                - when: "{{ outcome.status == 'ok' }}"
                  then:
                    do: continue
                    set_ctx: {v: "{{ outcome.result.v }}"}
                    set_iter: {seen: true}
                - else:
                    then: {do: fail}
    next:
      spec: {mode: exclusive}
      arcs:
        - step: done
          when: "{{ outcome.status == 'ok' }}"
  - step: done
    tool: {kind: python, input: {v: "{{ ctx.v }}", started: "{{ ctx.started }}"}, code: "result = {'v': v, 'started': started}"}
"""


def _run(text, tmp_path):
    import yaml

    pb = load_playbook_dict(yaml.safe_load(text))
    return run_playbook(pb, data_dir=tmp_path)


def test_old_spellings_run_like_the_new_ones(tmp_path):
    old = _run(OLD, tmp_path / "old")
    assert old.status == "completed", old.results
    assert old.results["done"] == {"v": 13, "started": True}
    new_text = migrate_text(OLD, "old.yaml").text
    new = _run(new_text, tmp_path / "new")
    assert new.status == "completed" and new.results == old.results and new.ctx == old.ctx


def test_migrate_rewrites_every_renamed_key_and_is_idempotent():
    res = migrate_text(OLD, "old.yaml")
    new = res.text
    for old_key in ("args:", "set_ctx", "set_iter", "outcome"):
        assert old_key not in new, (old_key, new)
    assert "input: {base: 10}" in new and "input: {k: 3}" in new
    assert "ctx.started: true" in new and "ctx.v:" in new and "iter.seen: true" in new
    assert "output.status == 'ok'" in new and "output.result.v" in new
    assert "store: {kind: disk}" in new
    import yaml

    assert find_deprecated_spellings(yaml.safe_load(new)) == []
    assert migrate_text(new, "new.yaml").text == new  # nothing left to rewrite


def test_validate_warns_for_each_old_spelling_and_exits_0(tmp_path):
    f = tmp_path / "old.yaml"
    f.write_text(OLD)
    r = subprocess.run([sys.executable, "-m", "noetl_dagster.commands.main", "validate", str(f)],
                       capture_output=True, text=True, timeout=60)  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    warnings = [line for line in r.stderr.splitlines() if ": warning: deprecated-key: " in line]
    text = "\n".join(warnings)
    assert f"{f}:7: warning: deprecated-key: workflow[0].args: step `args` is deprecated; use `input`" in text
    assert "workflow[0].set_ctx: `set_ctx` is deprecated; use `set: {ctx.<key>: ...}`" in text
    assert "task `args` is deprecated" in text and "`set_iter` is deprecated" in text
    assert "template variable `outcome` is deprecated; use `output`" in text
    assert (
        "workflow[0].tool[0].first.output.store.kind: output store kind `object` is deprecated; use `disk`"
        in text
    )
    assert len(warnings) == 9
    js = subprocess.run([sys.executable, "-m", "noetl_dagster.commands.main", "validate", "--json", str(f)],
                        capture_output=True, text=True, timeout=60)  # fmt: skip
    assert js.returncode == 0 and json.loads(js.stdout) == []  # warnings are not errors


def test_input_and_args_together_is_an_error(tmp_path):
    f = tmp_path / "both.yaml"
    f.write_text(OLD.replace("    args: {base: 10}\n", "    args: {base: 10}\n    input: {base: 11}\n"))
    r = subprocess.run([sys.executable, "-m", "noetl_dagster.commands.main", "validate", str(f)],
                       capture_output=True, text=True, timeout=60)  # fmt: skip
    assert r.returncode == 1
    assert (
        "input-and-args: workflow[0].args: step 'start' has both `input` and its old spelling `args`"
        in r.stdout
    )


# -- arc `args` -> `set: {step.*}` (issue 32.5) -------------------------------------------------------

ARC_ARGS_OLD = """\
apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: arcargs, path: tests/arcargs}
workflow:
  - step: start
    tool: {kind: noop}
    next:
      spec: {mode: inclusive}
      arcs:
        - step: handle
          args: {job: backup, n: 1}
        - step: handle
          args: {job: report, n: "{{ 1 + 1 }}"}
          set: {ctx.routed: true}
  - step: handle
    tool: {kind: python, input: {job: "{{ args.job }}", bare: "{{ n }}"}, code: "result = {'job': job, 'n': bare}"}
    set: {ctx.seen: "{{ (ctx.seen or []) + [handle.job ~ handle.n] }}"}
"""


def test_arc_args_warns_and_migrates_to_set_step_with_the_same_run(tmp_path):
    import yaml

    f = tmp_path / "old.yaml"
    f.write_text(ARC_ARGS_OLD)
    r = subprocess.run([sys.executable, "-m", "noetl_dagster.commands.main", "validate", str(f)],
                       capture_output=True, text=True, timeout=60)  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    warnings = [line for line in r.stderr.splitlines() if ": warning: deprecated-key: " in line]
    assert warnings == [
        f"{f}:11: warning: deprecated-key: workflow[0].next.arcs[0].args: arc `args` is deprecated; use "
        "`set: {step.<key>: ...}` (`noetl-dagster migrate` rewrites it)",
        f"{f}:13: warning: deprecated-key: workflow[0].next.arcs[1].args: arc `args` is deprecated; use "
        "`set: {step.<key>: ...}` (`noetl-dagster migrate` rewrites it)",
    ], r.stderr
    new = migrate_text(ARC_ARGS_OLD, "old.yaml").text
    assert "args: {" not in new and "set: {step.job: backup, step.n: 1}" in new, new
    assert "set: {ctx.routed: true, step.job: report" in new, new
    assert find_deprecated_spellings(yaml.safe_load(new)) == []
    assert migrate_text(new, "new.yaml").text == new
    old_run, new_run = _run(ARC_ARGS_OLD, tmp_path / "o"), _run(new, tmp_path / "n")
    assert old_run.status == new_run.status == "completed", (old_run.results, new_run.results)
    # two tokens with their own payloads (a ctx write would have let the last one win)
    assert sorted(old_run.ctx["seen"]) == sorted(new_run.ctx["seen"]) == ["backup1", "report2"]
    assert new_run.ctx["routed"] is True
    (tmp_path / "new.yaml").write_text(new)
    r = subprocess.run([sys.executable, "-m", "noetl_dagster.commands.main", "validate", str(tmp_path / "new.yaml")],
                       capture_output=True, text=True, timeout=60)  # fmt: skip
    assert r.returncode == 0 and "warning" not in r.stderr, r.stderr


def test_arc_args_and_set_step_writing_one_key_is_an_error():
    import yaml

    from noetl_dagster.dsl.parse import parse_playbook

    doc = yaml.safe_load(ARC_ARGS_OLD)
    doc["workflow"][0]["next"]["arcs"][0]["set"] = {"step.job": "x"}
    _, issues = parse_playbook(doc)
    assert [(i.rule, i.path) for i in issues] == [
        ("arc-args-and-set", "workflow[0].next.arcs[0].set.step.job")
    ]
