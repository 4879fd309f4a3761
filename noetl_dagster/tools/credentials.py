"""Credential lookup shared by the tool kinds: keychain failures become tool errors."""

from __future__ import annotations

from typing import Any

from noetl_dagster.tools.registry import ToolContext, ToolError


def lookup_credential(ctx: ToolContext, name: str, tool: str) -> dict[str, Any]:
    """``ctx.credential(name)``; an unknown or unresolvable name is a non-retryable ``auth_error``."""
    try:
        return ctx.credential(name)
    except KeyError as e:  # the keychain's UnknownCredential
        raise ToolError(f"{tool}: {e}", kind="auth_error", code="unknown_credential") from None
    except RuntimeError as e:  # KeychainError: declared but could not be resolved
        raise ToolError(f"{tool}: {e}", kind="auth_error", code="credential_unresolved") from None
