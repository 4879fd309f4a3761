"""Issue 14.6: ``keychain.<name>`` in a template reads only declared credentials,
never another NOETL_CREDENTIAL_* variable of the environment."""

from __future__ import annotations

import pytest

from noetl_dagster.engine.keychain import Keychain, UnknownCredential


def test_template_namespace_refuses_undeclared_credentials(monkeypatch):
    monkeypatch.setenv("NOETL_CREDENTIAL_OTHER_PASSWORD", "s3cr3t-not-yours")
    monkeypatch.setenv("NOETL_CREDENTIAL_MINE_TOKEN", "tok-mine-123")
    kc = Keychain([{"name": "mine", "kind": "bearer", "token": "tok-declared-456"}])
    ns = kc.namespace()
    assert ns["mine"]  # declared: resolves
    with pytest.raises(UnknownCredential):
        ns["other"]
    assert "s3cr3t-not-yours" not in repr(kc.secret_values())
