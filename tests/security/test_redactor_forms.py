"""Issue 14.6: the redactor scrubs secrets used as mapping keys and their derived
forms (base64 as |b64encode gives it, percent-encoding)."""

from __future__ import annotations

import base64
from urllib.parse import quote

from noetl_dagster.engine.recorder import Redactor
from noetl_dagster.util.jsonutil import dumps


def test_keys_and_derived_forms_are_redacted():
    secret = "p@ss w/rd:42"
    r = Redactor()
    r.add([secret])
    value = {
        secret: "as a key",
        "b64": base64.b64encode(secret.encode()).decode(),
        "pct": "https://x/?q=" + quote(secret, safe=""),
        "raw": secret,
    }
    out = dumps(r.value(value))
    for form in (secret, base64.b64encode(secret.encode()).decode(), quote(secret, safe="")):
        assert form not in out
