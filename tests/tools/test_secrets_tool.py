"""kind: secrets reads through the keychain and registers the value for redaction."""

from __future__ import annotations

import json

import pytest

from noetl_dagster.engine.keychain import EnvProvider, Keychain
from noetl_dagster.tools.registry import ToolError, get_tool
from noetl_dagster.tools.secrets import secrets_tool


def keychain() -> Keychain:
    env = EnvProvider(
        {
            "NOETL_CREDENTIAL_API": json.dumps({"type": "bearer", "token": "tok-secret-123"}),
            "NOETL_CREDENTIAL_PG_LOCAL": json.dumps(
                {"type": "postgres", "data": {"db_host": "h", "db_password": "pw-777"}}
            ),
            "NOETL_CREDENTIAL_MULTI": json.dumps({"a": "1111", "b": "2222"}),
        }
    )
    return Keychain(
        [{"name": "declared", "kind": "static", "map": {"client_secret": "cs-999"}}], providers=[env]
    )


def test_registered():
    assert get_tool("secrets").fn is secrets_tool


def test_reads_a_field_and_redacts_it(make_ctx):
    ctx = make_ctx(keychain())
    out = secrets_tool({"name": "pg_local", "field": "db_password"}, ctx)
    assert out == {
        "name": "pg_local",
        "field": "db_password",
        "ref": "keychain:pg_local.db_password",
        "value": "pw-777",
    }
    assert "pw-777" in ctx.redacted and "pw-777" in ctx.keychain.secret_values()


def test_picks_the_obvious_field(make_ctx):
    ctx = make_ctx(keychain())
    assert secrets_tool({"secret_name": "api"}, ctx)["field"] == "token"
    assert secrets_tool({"name": "declared"}, ctx)["value"] == "cs-999"


def test_ambiguous_missing_and_unknown(make_ctx):
    ctx = make_ctx(keychain())
    with pytest.raises(ToolError, match="several fields \\(a, b\\)"):
        secrets_tool({"name": "multi"}, ctx)
    with pytest.raises(ToolError, match="has no field 'zzz'"):
        secrets_tool({"name": "multi", "field": "zzz"}, ctx)
    with pytest.raises(ToolError, match="unknown credential 'ghost'") as info:
        secrets_tool({"name": "ghost"}, ctx)
    assert info.value.kind == "auth_error"
    with pytest.raises(ToolError, match="'name'.*is required"):
        secrets_tool({}, ctx)
