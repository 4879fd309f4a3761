"""Vocabulary shared by the migration rules: API versions, kind aliases, step keys, storage kinds."""

from __future__ import annotations

import re

STANDARD_API = "noetl.io/v2"


OLD_APIS = frozenset({"noetl.io/v1", "noetl.io/v10", "noetl/v1", "v1"})


KIND_ALIASES = {"playbooks": "playbook", "secret": "secrets"}


ROUTING_ONLY_TYPES = frozenset({"end", "start", "router", "route", "pass_through"})


# keys of a v1 step that are step-level; every other key is the inline tool's config
V1_STEP_KEYS = frozenset({
    "step", "desc", "description", "type", "task", "with", "args", "input", "loop", "end_loop", "case", "next",
    "sink", "save", "retry", "result", "vars", "when", "spec", "set", "tool", "pass", "call", "output",
})  # fmt: skip


ARGS_NATIVE_KINDS = frozenset({"container", "shell", "script", "job", "k8s"})


RAW_TEXT_KEYS = frozenset({"code", "code_b64", "code_base64"})


BACKOFFS = frozenset({"none", "fixed", "linear", "exponential"})


SINK_KIND_KEYS = ("backend", "storage", "kind", "type")


EVENT_LOG_KINDS = frozenset({"event_log", "event", "events", "log_event"})


STORAGE_KINDS = frozenset({"parquet", "arrow", "iceberg"})


STORAGE_KIND_KEYS = frozenset({"uri", "resource", "namespace", "partition_by", "compression", "store", "catalog",
                               "catalog_name", "registry"})  # fmt: skip


_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


_TABLE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)?$")


ARG_KEYS = ("with", "args", "data", "input")  # what a legacy target passes on (v1 `data` / `input` spellings)


_COMMAND_N = re.compile(r"command_\d+")
