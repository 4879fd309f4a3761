"""Every template a user can write renders (or compiles) through the one template gate
(``dsl.templates.template_env``, issue 29.2 limits): a keychain declaration rendered by the
keychain's own default renderer, and the migrator's check that a ``{{ expression }}`` parses.

Each hostile input runs in a child process under RLIMIT_AS 1 GiB: through the gate it ends in
a limit error; outside it (the old code) it failed with MemoryError after allocating gigabytes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# templates that allocate gigabytes unless the size is checked before allocation
HOSTILE = [
    "{{ (['x'*1000000]*2500)|join|length }}",
    "{{ (['x'*1000000]*2500)|tojson|length }}",
    "{{ '{}'.format(['x'*1000000]*2500)|length }}",
    "prefix {{ ('x'*1000000000)|length }}",
]


def _in_child(code: str, payload: object) -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], input=json.dumps(payload),
                          capture_output=True, text=True, timeout=300, cwd=ROOT, env=env)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


KEYCHAIN_CHILD = """
import json, resource, sys
from noetl_dagster.engine.keychain import Keychain
resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))
out = {}
for i, src in enumerate(json.loads(sys.stdin.read())):
    kc = Keychain([{"name": "k", "kind": "static", "map": {"x": src}}], providers=[], context={"workload": {}})
    try:
        kc.credential("k")
        out[src] = "accepted"
    except BaseException as e:
        out[src] = type(e).__name__ + ": " + str(e)[:300]
print(json.dumps(out))
"""


def test_keychain_default_renderer_is_bounded_by_the_template_limits():
    """A keychain built without the engine's renderer (tests, storage, plug-ins) renders its
    declarations through the gate: a hostile default is refused by a limit, never allocated."""
    outcomes = _in_child(KEYCHAIN_CHILD, HOSTILE)
    for src, outcome in outcomes.items():
        assert outcome.startswith("KeychainError: keychain 'k': rendering its fields failed"), (src, outcome)
        assert "limit: " in outcome and "MemoryError" not in outcome, (src, outcome)


def test_keychain_default_renderer_is_the_sandbox():
    from noetl_dagster.engine.keychain import Keychain, KeychainError  # noqa: PLC0415

    kc = Keychain(
        [{"name": "k", "kind": "static", "map": {"x": "{{ workload|attr('__class__') }}"}}], providers=[]
    )
    try:
        kc.credential("k")
    except KeychainError as e:
        assert "SecurityError" in str(e) and "__class__" in str(e), e
    else:
        raise AssertionError("an unsafe attribute rendered")


MIGRATE_CHILD = """
import json, resource, sys
from noetl_dagster.dsl.migrate.templates import single_expression
resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))
out = {}
for src in json.loads(sys.stdin.read()):
    try:
        out[src] = single_expression(src)
    except BaseException as e:
        out[src] = type(e).__name__ + ": " + str(e)[:300]
out["peak_rss_mb"] = next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmHWM:")) // 1024
print(json.dumps(out))
"""


def test_migrate_parses_a_condition_without_evaluating_it():
    """The migrator asks whether a v1 condition is one ``{{ expression }}``: compiling it in a
    plain jinja2 Environment folded constants: ``'x' * 10**8`` was built (and its repr written
    into generated code) at compile time, 400 MB at peak; a larger one failed with MemoryError."""
    cases = {
        "{{ 'x' * 100000000 }}": "'x' * 100000000",
        "{{ 'x'|center(100000000) }}": "'x'|center(100000000)",
        "{{ ('ab' * 10) * 10000000 }}": "('ab' * 10) * 10000000",
        "{{ workload.a == 1 }}": "workload.a == 1",
        "{{ a b }}": None,  # does not parse
    }
    outcomes = _in_child(MIGRATE_CHILD, list(cases))
    peak = outcomes.pop("peak_rss_mb")
    assert outcomes == cases
    assert peak < 150, f"{peak} MB at peak: the expression was evaluated"
