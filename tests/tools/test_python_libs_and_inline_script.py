"""python tool: `libs` forms of the runtime dialect, and inline `script`."""

import pytest

from noetl_dagster.dsl import load_playbook_dict
from noetl_dagster.runners.local import run_playbook


def _run(tool, workload=None):
    pb = load_playbook_dict({
        "apiVersion": "noetl.io/v2", "kind": "Playbook", "metadata": {"name": "p", "path": "p"},
        "workload": workload or {}, "workflow": [{"step": "start", "tool": tool}],
    })  # fmt: skip
    return run_playbook(pb)


def test_libs_from_import_and_alias_forms(data_dir):
    r = _run({"kind": "python", "libs": {"dt": {"from": "datetime", "import": "date"}, "m": "math", "D": {"from": "decimal", "import": "Decimal"}},
              "code": "result = {'y': dt(2020, 1, 2).year, 'pi': round(m.pi, 2), 'd': str(D('1.5'))}"})  # fmt: skip
    assert r.status == "completed"
    assert r.results["start"] == {"y": 2020, "pi": 3.14, "d": "1.5"}


def test_libs_list_form(data_dir):
    r = _run(
        {
            "kind": "python",
            "libs": ["math", {"import": "json", "as": "j"}],
            "code": "result = j.dumps(math.floor(2.7))",
        }
    )
    assert r.results["start"] == "2"


def test_unknown_lib_is_an_error_outcome(data_dir):
    r = _run({"kind": "python", "libs": {"x": "no_such_module_here"}, "code": "result = 1"})
    assert r.status == "failed"
    assert "cannot import" in r.results["start"]["error"]["message"]


def test_inline_script_is_rendered_from_the_workload(data_dir):
    r = _run({"kind": "python", "script": {"uri": "inline", "source": {"type": "inline", "code": "{{ test_code }}"}}},
             {"test_code": "result = {'ok': 6 * 7}"})  # fmt: skip
    assert r.results["start"] == {"ok": 42}


@pytest.mark.parametrize("script", [{"uri": "inline", "source": {"type": "inline"}}])
def test_inline_script_without_code_is_a_clear_error(data_dir, script):
    r = _run({"kind": "python", "script": script})
    assert r.status == "failed" and "source.code" in r.results["start"]["error"]["message"]
