"""Helpers shared by the lineage tests."""

from __future__ import annotations

import json

from openlineage.client.serde import Serde


def as_json(run_event) -> dict:
    """A RunEvent as the JSON document a transport sends."""
    return json.loads(Serde.to_json(run_event))
