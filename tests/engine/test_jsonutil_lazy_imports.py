"""util.jsonutil without decimal and base64 at import (issue 46 start-up): a Decimal and bytes still
encode as before."""

from __future__ import annotations

import json
from decimal import Decimal

from noetl_dagster.util.jsonutil import dumps, to_jsonable


def test_a_decimal_and_bytes_encode_as_before():
    assert to_jsonable(Decimal("1.5")) == 1.5
    assert to_jsonable(b"\x00hi") == {"$bytes_b64": "AGhp"}
    assert json.loads(dumps({"d": Decimal("2.25"), "b": b"hi"})) == {"d": 2.25, "b": {"$bytes_b64": "aGk="}}
