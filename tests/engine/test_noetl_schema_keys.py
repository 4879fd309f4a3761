"""Every key of NoETL's playbook JSON schema is either implemented here or reported by validate
(an error, or a ``no-effect`` / ``executor-no-effect`` warning): nothing is silently ignored (issue 16.4).

The schema is vendored as data (tests/engine/data/noetl_playbook.schema.json, from noetl/noetl
noetl/core/dsl/playbook.schema.json at commit ec6be86e9d079d8bf8de45cc8f2cd11d8ed6a02e). A key NoETL
adds later fails this test until it is implemented or reported.
"""

from __future__ import annotations

import pytest
from schema_walk import dotted, issues_for, sample_playbook, schema_keys

W, WB, L = "workflow[0]", "workbook[0].tool", "workflow[0].loop"
# key -> where it is implemented (docs/dsl.md has the semantics)
IMPLEMENTED = {
    "apiVersion": "dsl.parse (noetl.io/v2; v10 is refused)",
    "workload": "engine start", "keychain": "engine.keychain", "workbook": "kind: workbook",
    "workbook[0].name": "kind: workbook", f"{WB}.kind": "dsl.kinds", f"{WB}.spec": "task spec knobs",
    f"{WB}.spec.policy.rules": "engine.worker task policy",
    "executor": "dsl.executor_spec", "executor.spec": "dsl.executor_spec",
    "executor.spec.no_next_is_error": "engine.control dead_end_is_error",
    f"{W}.step": "step name", f"{W}.desc": "documentation only (kept in the model)", f"{W}.spec": "step spec",
    f"{W}.spec.policy": "step policy (admit)", f"{W}.spec.policy.admit.rules": "engine.control _admit",
    f"{W}.input": "step input", f"{W}.set": "step set (ctx/iter/step)",
    f"{L}.in": "loops", f"{L}.iterator": "loops", f"{L}.spec": "loops", f"{L}.spec.mode": "loops",
    f"{L}.spec.max_in_flight": "loops", f"{L}.spec.policy": "loops", f"{L}.spec.policy.exec": "loops (Dagster fan-out)",
    f"{L}.cursor.auth": "cursor loops", f"{L}.cursor.claim": "cursor loops", f"{L}.cursor.options": "cursor drivers",
    f"{L}.spec.frame": "cursor frames", f"{L}.spec.frame.max_rows": "cursor frames",
    f"{L}.spec.frame.lease_seconds": "cursor frames", f"{L}.spec.frame.heartbeat_seconds": "cursor heartbeat",
    f"{L}.spec.frame.row_concurrency": "cursor frames", f"{L}.spec.frame.process": "cursor frames (row|frame)",
    f"{L}.spec.frame.max_attempts": "cursor frames",
    f"{W}.next": "routing", f"{W}.next.spec": "routing", f"{W}.next.spec.mode": "routing",
    f"{W}.next.spec.on_no_match": "routing", f"{W}.next.arcs": "routing",
    f"{W}.next.arcs[0].when": "routing", f"{W}.next.arcs[0].set": "routing",
}  # fmt: skip
KEYS = schema_keys()


def test_the_walk_sees_the_whole_schema():
    assert len(KEYS) > 90
    assert {dotted(p) for p, _ in KEYS} >= set(IMPLEMENTED)


@pytest.mark.parametrize("path,sample", KEYS, ids=[dotted(p) for p, _ in KEYS])
def test_every_noetl_schema_key_is_implemented_or_reported(path, sample, tmp_path):
    key = dotted(path)
    issues, warnings = issues_for(sample_playbook(path, sample), tmp_path)
    at_or_under = [i for i in issues + warnings if i.path == key or i.path.startswith((key + ".", key + "["))]
    # a no-effect warning on an ancestor covers its whole subtree (executor.requires.tools)
    above = [w for w in warnings if w.rule.endswith("no-effect") and key.startswith(w.path + ".")]
    if key in IMPLEMENTED:
        assert not [w for w in at_or_under + above if w.rule.endswith("no-effect")], (
            f"{key} is implemented, not warned"
        )
        return
    assert at_or_under or above, f"NoETL schema key {key} is neither implemented nor reported by validate"
