"""``kind: secrets``: read one secret through the keychain.

Inputs: ``name`` (aliases ``secret``, ``secret_name``, ``credential``, ``auth``) —
a root ``keychain:`` entry or a stored credential — and optional ``field``
(default: the only field, else ``value`` / ``secret`` / ``token`` / ``password``).

Result: ``{name, field, ref, value}``. ``ref`` (``keychain:<name>.<field>``) is
the stable reference. ``value`` is registered for redaction, so the recorded
result — and with it the execution state rebuilt from the events — holds
``***``, as does every log line, error message and ``--json`` output. Where a
later step needs the secret itself, it reads ``{{ keychain.<name>.<field> }}``,
which resolves afresh and is redacted the same way.

In the runtime dialect (``tool: [{name: label, kind: ...}]``) ``name`` is the
task's label: give the secret as ``secret_name`` (or ``secret``) there.
"""

from __future__ import annotations

from typing import Any

from noetl_dagster.tools.configs import SecretsConfig
from noetl_dagster.tools.credentials import lookup_credential
from noetl_dagster.tools.registry import ToolContext, ToolError, register_tool

PREFERRED_FIELDS = (
    "value",
    "secret",
    "secret_value",
    "token",
    "access_token",
    "api_key",
    "password",
    "db_password",
)


def secrets_tool(inputs: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
    """Read a secret from the keychain; the value is redacted everywhere it is recorded."""
    name = next(
        (inputs[k] for k in ("name", "secret", "secret_name", "credential", "auth") if inputs.get(k)), None
    )
    if not isinstance(name, str) or not name:
        raise ToolError(
            "secrets: 'name' (a keychain entry or credential name) is required", kind="config_error"
        )
    record = lookup_credential(ctx, name, "secrets")
    field = inputs.get("field") or inputs.get("key")
    if field is None:
        strings = [k for k, v in record.items() if isinstance(v, str) and k != "type"]
        if len(strings) == 1:
            field = strings[0]
        else:
            field = next((f for f in PREFERRED_FIELDS if f in record), None)
        if field is None:
            raise ToolError(
                f"secrets: {name!r} has several fields ({', '.join(sorted(record))}); say which with 'field'",
                kind="config_error",
            )
    if field not in record:
        raise ToolError(
            f"secrets: {name!r} has no field {field!r} (fields: {', '.join(sorted(record))})",
            kind="secret_not_found",
        )
    value = record[field]
    if isinstance(value, str):
        ctx.redact(value)
    return {"name": name, "field": field, "ref": f"keychain:{name}.{field}", "value": value}


register_tool(
    "secrets",
    secrets_tool,
    config=SecretsConfig,
    description="Read a secret from the keychain (value redacted in events)",
)
