"""Run the CLI in a fresh interpreter and report, at exit, what it imported and which pydantic models it built.

Shared by the import-set guard (tests/architecture/test_import_set.py) and the parse-cache tests
(tests/commands/test_run_cache.py): a model with defer_build reports built only once it validated.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MARKER = "\nPROBE "

# the modules whose BaseModel classes are reported when built (only if the module was imported)
MODEL_MODULES = ("noetl_dagster.tools.configs", "noetl_dagster.dsl.model")

WRAPPER = (
    textwrap.dedent(
        """
    import atexit, json, sys

    def _report():
        built = {}
        for name in MODEL_MODULES_HERE:
            module = sys.modules.get(name)
            if module is None:
                built[name] = []
                continue
            from pydantic import BaseModel
            built[name] = sorted(n for n, o in vars(module).items()
                                 if isinstance(o, type) and issubclass(o, BaseModel) and o.__pydantic_complete__)
        sys.__stdout__.write(MARKER_HERE + json.dumps({"modules": sorted(sys.modules), "built": built}) + "\\n")
        sys.__stdout__.flush()

    atexit.register(_report)
    from noetl_dagster.commands.main import main
    sys.argv = ["noetl-dagster", *sys.argv[1:]]
    main()
    """
    )
    .replace("MODEL_MODULES_HERE", repr(MODEL_MODULES))
    .replace("MARKER_HERE", repr(MARKER))
)

ONE_STEP = """\
apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: one_step, path: tests/one_step}
workload: {n: 2}
workflow:
  - step: start
    tool: {kind: noop, result: "{{ workload.n * 2 }}"}
"""


def probe(args: list[str], env: dict[str, str], cwd: Path | None = None) -> tuple[int, dict, str, str]:
    """(exit code, {"modules": [...], "built": {module: [model names]}}, stdout before the report, stderr)."""
    r = subprocess.run([sys.executable, "-c", WRAPPER, *args], capture_output=True, text=True, env=env,
                       stdin=subprocess.DEVNULL, timeout=120, cwd=cwd)  # fmt: skip
    at = r.stdout.rfind(MARKER)
    assert at != -1, r.stdout[-2000:] + r.stderr[-2000:]
    return r.returncode, json.loads(r.stdout[at + len(MARKER) :]), r.stdout[:at], r.stderr
