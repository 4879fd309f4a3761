"""Quantum test fixtures: a private data dir and a tool context on it."""

from __future__ import annotations

import pytest


@pytest.fixture
def home(tmp_path, monkeypatch):
    d = tmp_path / "home"
    monkeypatch.setenv("NOETL_DAGSTER_HOME", str(d))
    return d


@pytest.fixture
def ctx(make_ctx, home):
    return make_ctx(data_dir=home)
