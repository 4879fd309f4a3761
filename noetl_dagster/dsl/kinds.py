"""The tool-kind catalogue: which ``kind:`` names exist and how to load them.

A tool kind is a callable ``(inputs: dict, ctx: ToolContext) -> result`` (see
``noetl_dagster.engine.ports``) with a typed pydantic config model. Every kind, built in
or third party, is declared in the ``noetl_dagster.tools`` entry-point group
(``name = "package.module:attr"``, docs/tools.md "Adding a tool kind"): loading the entry
point imports the module, whose :func:`register_tool` call names the kind, its config model
and its raw keys. This package's own kinds are also listed in :data:`BUILTIN_KINDS`, so a
built-in name is answered without scanning the installed distributions (the scan runs at the
first name that is not built in; a plugin cannot take a built-in kind's name). Validation asks
this catalogue for names without importing any tool module; the engine asks it for the kind
and calls :meth:`ToolKind.invoke`.

A plugin that fails to load (import error, missing attribute) becomes a *broken* kind: its
name stays known, every call fails with a ``plugin_error`` naming the entry point and the
cause, and every other kind still loads. A built-in kind whose optional extra is not installed
(``quantum``, ``qdrant``, ...) is reported the same way at validation and at its first call:
``tool kind 'quantum' needs: pip install 'noetl-dagster[quantum]'`` (:func:`missing_extra`).
"""

from __future__ import annotations

import importlib
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

from noetl_dagster.util.extras import extra_for_module, install_hint, missing_kind_extra

if (
    TYPE_CHECKING
):  # importlib.metadata (~20 ms, a scan of every distribution) only when a name is not built in
    from importlib.metadata import EntryPoint

    from pydantic import BaseModel

ToolFn = Callable[[dict[str, Any], Any], Any]  # (inputs, engine.ports.ToolContext) -> result
ENTRY_POINT_GROUP = "noetl_dagster.tools"
DISTRIBUTION = "noetl-dagster"


class KindError(Exception):
    """A kind could not be called; the engine makes it an error outcome of this ``kind``."""

    kind = "tool_error"


class ToolConfigError(KindError):
    """A kind's rendered config does not match its config model."""

    kind = "config_error"


class PluginLoadError(KindError):
    """A plugin's entry point did not load (import error, missing attribute)."""

    kind = "plugin_error"


class _ConfigModel:
    """``ToolKind.config``: the model class, or a ``"module:Name"`` reference imported at its first read,
    so registering a kind defines no pydantic model (a run whose kinds' configs need no validating
    imports no pydantic, issue 35)."""

    def __get__(self, obj: Any, owner: Any = None) -> Any:
        if obj is None:
            return None  # the dataclass default
        model = obj.__dict__["_config"]
        if isinstance(model, str):
            model = obj.__dict__["_config"] = _load_target(model)
        return model

    def __set__(self, obj: Any, value: Any) -> None:
        obj.__dict__["_config"] = value


@dataclass
class ToolKind:
    name: str
    fn: ToolFn
    # config keys the engine must not render before the call (code, nested specs)
    raw_keys: frozenset[str] = field(default_factory=frozenset)
    description: str = ""
    # the typed config model (validated before every call), or "module:Name" of it (_ConfigModel)
    config: type[BaseModel] | None = _ConfigModel()  # type: ignore[assignment]
    source: str = ""  # the entry point value ("module:attr") or "register_tool" for in-process kinds
    distribution: str = ""  # the package that declares the entry point
    error: str | None = None  # set on a broken plugin: why it did not load
    # declared with a config given by reference: the model is plain (_plain_fields: extra keys
    # allowed, every field Any or `str | None`, these the `str | None` ones, no validator), so a
    # string-keyed mapping whose named keys hold a str or None validates: such a call validates
    # nothing and imports no model (issue 35); tests/tools/test_config_accepts_any.py checks each
    # declaration against its model. None: validate (the model decides).
    plain_config: frozenset[str] | None = None

    def config_schema(self) -> dict[str, Any] | None:
        return self.config.model_json_schema() if self.config is not None else None

    def check_config(self, inputs: dict[str, Any]) -> None:
        """Validate rendered inputs against the config model; one line per problem."""
        plain = self.plain_config
        if (
            plain is not None
            and type(inputs) is dict
            and all(type(k) is str for k in inputs)
            and all(type(inputs.get(f)) in _STR_OR_NONE for f in plain)
        ):
            return  # valid by the declaration (tested against the model): the model is not even imported
        if self.config is None:
            return
        key = self._valid_key(inputs)
        if key is not None:
            try:
                if key in _VALID:
                    return  # this exact config (up to its free `input`) validated before
            except TypeError:  # an unhashable value: not cached
                key = None
        if _ACCEPTS_ANY.get(self.config) and type(inputs) is dict and all(type(k) is str for k in inputs):
            return  # every field Any, extra keys allowed, no validator: no mapping can fail (noop)
        from pydantic import ValidationError  # noqa: PLC0415 - loaded with the config model anyway

        try:
            self.config.model_validate(inputs)
            if key is not None:
                if len(_VALID) > 4096:
                    _VALID.clear()
                _VALID[key] = None
        except ValidationError as e:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in err['loc']) or '<config>'}: {err['msg']}"
                for err in e.errors()[:5]
            )
            raise ToolConfigError(f"kind {self.name!r}: invalid config: {problems}") from None

    def _valid_key(self, inputs: dict[str, Any]) -> tuple | None:
        """A cache key for a config that passed validation: every key but ``input`` with its value's
        type (1, 1.0 and True hash alike), when the model leaves ``input`` free (typed Any, no
        validator); else None (validate every call). A key with an unhashable value is not cached. A python
        task's config is its code plus the rendered input: validated once per code, not per call."""
        model = self.config
        if model is None:
            return None
        free = _INPUT_FREE.get(model)
        if free is None:
            free = _INPUT_FREE[model] = _input_free(model)
            _ACCEPTS_ANY[model] = free and _accepts_any(model)  # implies free
        if not free:
            return None
        return (model, *[(k, type(v), v) for k, v in inputs.items() if k != "input"])  # hashed by the caller

    def invoke(self, inputs: dict[str, Any], ctx: Any) -> Any:
        self.check_config(inputs)
        return self.fn(inputs, ctx)


_STR_OR_NONE = (str, type(None))
_VALID: dict[tuple, None] = {}  # configs that passed their model (ToolKind._valid_key)
_INPUT_FREE: dict[Any, bool] = {}
_ACCEPTS_ANY: dict[Any, bool] = {}  # models no string-keyed mapping can fail (ToolKind.check_config)


def _input_free(model: type[BaseModel]) -> bool:
    """Whether a model accepts any ``input`` whatever the other fields hold: ``input`` typed Any
    and no validator on the model or on any field (a validator may read ``input``)."""
    f = model.model_fields.get("input")
    decorators = model.__pydantic_decorators__
    validators = (decorators.model_validators, decorators.field_validators, decorators.root_validators,
                  decorators.validators)  # fmt: skip
    return f is not None and f.annotation is Any and not f.metadata and not any(validators)


def _accepts_any(model: type[BaseModel]) -> bool:
    """Whether every string-keyed mapping validates (so validating it, and building the model's
    validator, can be skipped; a noop run builds none, issue 35): extra keys allowed, every field typed
    Any without constraints or a required value, no validator of any kind (as ``_input_free``), no
    ``model_post_init``, no computed field, no core schema of its own."""
    return _plain_fields(model) == frozenset()


# model_config keys that change no validation outcome of a plain model (a str length limit would)
_PLAIN_CONFIG_KEYS = frozenset(
    {"extra", "populate_by_name", "defer_build", "arbitrary_types_allowed", "title"}
)


def _plain_fields(model: type[BaseModel]) -> frozenset[str] | None:
    """The ``str | None`` fields of a plain model, else None. Plain: as ``_accepts_any`` (extra keys
    allowed, no validator, post-init, computed field or schema of its own, nothing required, no
    constraint, no alias, no config that limits strings), every field typed Any or ``str | None``.
    A string-keyed mapping whose ``str | None`` keys hold a str or None validates against it."""
    cfg = model.model_config
    if not (
        _input_free(model)
        and cfg.get("extra") == "allow"
        and set(cfg) <= _PLAIN_CONFIG_KEYS
        and getattr(model, "__pydantic_post_init__", None) is None
        and "__get_pydantic_core_schema__" not in model.__dict__  # a schema of its own: validate
        and not model.__pydantic_decorators__.computed_fields
    ):
        return None
    named = []
    for name, f in model.model_fields.items():
        if f.metadata or f.is_required() or f.default_factory is not None or f.alias or f.validation_alias:
            return None
        if f.annotation is Any:
            continue
        if f.annotation == (str | None) and f.default is None:
            named.append(name)
            continue
        return None
    return frozenset(named)


_lock = threading.RLock()
_REGISTRY: dict[str, ToolKind] = {}
_BROKEN: dict[str, ToolKind] = {}
_GENERATION = [
    0
]  # bumped when register_tool replaces a kind: playbooks cached by files.load_playbook are stale
_ENTRY_POINTS: dict[str, EntryPoint] | None = None
_MISSING: dict[str, str | None] = {}  # kind -> install hint of its missing extra (None: installed)

# Raw keys of this package's kinds, so validating a playbook imports no tool module. Only a hint:
# the registered kind's own raw_keys win once it is loaded (tests/tools/test_plugins.py checks both agree).
_NONE: frozenset[str] = frozenset()
_RAW_KEY_HINTS: dict[str, frozenset[str]] = {
    "playbook": frozenset({"definition"}),  # an inline child: its templates are its own
    "python": frozenset({"code", "code_b64", "code_base64"}),
    "flow_input": frozenset({"literal", "literal_b64"}),
    **dict.fromkeys(
        (
            "noop",
            "workbook",
            "http",
            "postgres",
            "duckdb",
            "secrets",
            "parquet",
            "arrow",
            "iceberg",
            "qdrant",
            "quantum",
            "flow_guard",
            "resource",
            "shell",
            "script",
            "transfer",
            "snowflake",
            "artifact",
            "result_fetch",
            "nats",
            "mcp",
            "agent",
            "container",
            "gcs",
            "snowflake_transfer",
            "rhai",
            "ducklake",
        ),
        _NONE,
    ),
}


# This package's kinds: pyproject.toml's [project.entry-points."noetl_dagster.tools"], name by name
# (tests/tools/test_plugins.py keeps them equal). A built-in name is answered from here, so validating
# and running a playbook of built-in kinds never scans the installed distributions' entry points
# (~15-40 ms: every distribution's entry_points.txt, and a METADATA parse per entry point for its
# distribution's name); the scan runs once a name is not built in (a plugin, or a typo to report).
BUILTIN_KINDS: dict[str, str] = {
    "noop": "noetl_dagster.tools.core:noop_tool",
    "workbook": "noetl_dagster.tools.core:workbook_tool",
    "playbook": "noetl_dagster.tools.core:playbook_tool",
    "python": "noetl_dagster.tools.core:python_tool",
    "http": "noetl_dagster.tools.http:http_tool",
    "postgres": "noetl_dagster.tools.postgres:postgres_tool",
    "duckdb": "noetl_dagster.tools.duckdb_tool:duckdb_tool",
    "secrets": "noetl_dagster.tools.secrets:secrets_tool",
    "parquet": "noetl_dagster.tools.storage:parquet_tool",
    "arrow": "noetl_dagster.tools.storage:arrow_tool",
    "iceberg": "noetl_dagster.tools.storage:iceberg_tool",
    "qdrant": "noetl_dagster.tools.qdrant.tool:qdrant_tool",
    "quantum": "noetl_dagster.tools.quantum.tool:quantum_tool",
    "flow_input": "noetl_dagster.tools.flow:flow_input_tool",
    "flow_guard": "noetl_dagster.tools.flow:flow_guard_tool",
    "resource": "noetl_dagster.tools.flow:resource_tool",
    "shell": "noetl_dagster.tools.shell:shell_tool",
    "script": "noetl_dagster.tools.shell:script_tool",
    "transfer": "noetl_dagster.tools.transfer:transfer_tool",
    "snowflake": "noetl_dagster.tools.snowflake:snowflake_tool",
    "artifact": "noetl_dagster.tools.artifact:artifact_tool",
    "result_fetch": "noetl_dagster.tools.artifact:artifact_tool",
    "nats": "noetl_dagster.tools.nats:nats_tool",
    "mcp": "noetl_dagster.tools.mcp:mcp_tool",
    "agent": "noetl_dagster.tools.mcp:mcp_tool",
    "container": "noetl_dagster.tools.container:container_tool",
    "gcs": "noetl_dagster.tools.gcs:gcs_tool",
    "snowflake_transfer": "noetl_dagster.tools.snowflake_transfer:snowflake_transfer_tool",
    "rhai": "noetl_dagster.tools.rhai_tool:rhai_tool",
    "ducklake": "noetl_dagster.tools.ducklake:ducklake_tool",
}


# Kinds that only compute from their rendered config (no effect outside the execution): a task of
# one of them can be re-derived from the log, so the engine makes no barrier before it and groups it
# with its neighbours into one commit (docs/events.md "Durability at side effects"). flow_input and
# flow_guard are the flow syntax's templates-only kinds. Every other kind has effects, except a
# task of PURE_WHEN_MARKED whose author wrote ``pure: true`` (its code is the author's word).
PURE_KINDS: frozenset[str] = frozenset({"noop", "rhai", "flow_input", "flow_guard"})
PURE_WHEN_MARKED: frozenset[str] = frozenset({"python", "duckdb"})


def is_pure(kind: str, marked_pure: bool = False) -> bool:
    """Whether a task of ``kind`` (``pure: true`` when ``marked_pure``) has no effect outside the execution."""
    return kind in PURE_KINDS or (marked_pure and kind in PURE_WHEN_MARKED)


# NoETL's kinds (its schema's tool.kind list, its Rust worker's registry) that this runtime does not
# offer, each with the reason `validate` gives: none of upstream's kinds is merely "not recognized".
UNOFFERED_KINDS: dict[str, str] = {
    "gateway": "it answers callers of NoETL's gateway service (`action: callback` to API clients waiting on an "
    "execution) and this runtime has no gateway; post results to your endpoint with `kind: http`",
    "subscription": "it drains a Kafka or Pub/Sub subscription in NoETL's Rust worker and this runtime ships no "
    "Kafka or Pub/Sub consumer; for NATS JetStream use `loop.cursor` with `kind: nats_stream` (claimed rows, "
    "resumable) or `kind: nats` `js_consume`",
    "wasm": "it runs a WebAssembly module inside NoETL's Rust worker and this runtime embeds no WebAssembly "
    "engine; run the code with `kind: python`, `shell` or `container`",
    "task_sequence": "it is internal to NoETL's worker (a step's pipeline dispatched as one command); write the "
    "tasks as the step's `tool:` list",
}


def register_tool(
    name: str,
    fn: ToolFn | None = None,
    *,
    config: type[BaseModel] | str | None = None,
    raw_keys: frozenset[str] | set[str] = frozenset(),
    description: str = "",
    plain_config: frozenset[str] | None = None,
):
    """Register a tool kind; usable as a decorator: ``@register_tool("echo", config=EchoConfig)``.

    ``config`` may be ``"module:Name"`` of the model, imported at its first use; with it,
    ``plain_config`` declares the model plain and names its ``str | None`` fields (``ToolKind.plain_config``)."""
    if plain_config is not None and not isinstance(config, str):
        raise ValueError("plain_config is declared only with a config given by reference ('module:Name')")

    def deco(f: ToolFn) -> ToolFn:
        if _builtin_module(name) == getattr(f, "__module__", None):  # this package's kind, from its module
            source, dist = BUILTIN_KINDS[name], DISTRIBUTION
        else:
            ep = _entry_points().get(name)
            source, dist = (ep.value, _dist_name(ep)) if ep is not None else ("register_tool", "")
        with _lock:
            if name in _REGISTRY:  # a kind replaced: playbooks parsed against the old one are stale
                _GENERATION[0] += 1
            _REGISTRY[name] = ToolKind(
                name,
                f,
                frozenset(raw_keys),
                description or (f.__doc__ or "").strip().split("\n")[0],
                cast(Any, config),  # a model or its "module:Name" (_ConfigModel)
                source,
                dist,
                plain_config=plain_config,
            )
            _BROKEN.pop(name, None)
        return f

    return deco(fn) if fn is not None else deco


def _builtin_module(name: str) -> str | None:
    target = BUILTIN_KINDS.get(name)
    return target.partition(":")[0] if target else None


def _dist_name(ep: EntryPoint | None) -> str:
    dist = getattr(ep, "dist", None) if ep is not None else None
    return str(dist.metadata["Name"]) if dist is not None else ""


def _entry_points() -> dict[str, EntryPoint]:
    global _ENTRY_POINTS
    if _ENTRY_POINTS is None:
        from importlib.metadata import entry_points  # noqa: PLC0415 - see BUILTIN_KINDS

        eps: dict[str, EntryPoint] = {}
        for ep in entry_points(group=ENTRY_POINT_GROUP):
            eps.setdefault(ep.name, ep)  # the first distribution on sys.path wins a name clash
        _ENTRY_POINTS = eps
    return _ENTRY_POINTS


def refresh_entry_points() -> None:
    """Forget the cached entry points and broken kinds (after installing a plugin in-process)."""
    global _ENTRY_POINTS
    with _lock:
        _ENTRY_POINTS = None
        _BROKEN.clear()
        _MISSING.clear()


def _broken(name: str, source: str, dist: str, reason: str, *, message: str | None = None) -> ToolKind:
    message = (
        message or f"tool kind {name!r} failed to load from entry point {source!r} ({dist or '?'}): {reason}"
    )

    def fail(inputs: dict[str, Any], ctx: Any) -> Any:
        raise PluginLoadError(message)

    tk = ToolKind(name, fail, frozenset(), "", None, source, dist, message)
    _BROKEN[name] = tk
    return tk


def _load_target(target: str) -> Any:
    """``module:attr`` loaded as an entry point loads it (the module imported, the attribute path followed)."""
    module, _, attrs = target.partition(":")
    obj: Any = importlib.import_module(module.strip())
    for attr in filter(None, attrs.strip().split(".")):
        obj = getattr(obj, attr)
    return obj


def get_tool(name: str) -> ToolKind | None:
    """The kind's implementation, importing its module on first use (a broken plugin: a failing kind)."""
    tk = _REGISTRY.get(name) or _BROKEN.get(name)
    if tk is not None:
        return tk
    builtin = name in BUILTIN_KINDS
    if builtin:
        source, dist, load = BUILTIN_KINDS[name], DISTRIBUTION, (lambda: _load_target(BUILTIN_KINDS[name]))
    else:
        ep = _entry_points().get(name)
        if ep is None:
            return None
        source, dist, load = ep.value, _dist_name(ep), ep.load
    with _lock:
        if name in _REGISTRY:
            return _REGISTRY[name]
        missing = missing_extra(name)
        if missing:
            return _broken(name, source, dist, missing, message=missing)
        try:
            obj = load()  # importing the module registers the kind (with its config and raw keys)
        except ModuleNotFoundError as e:
            extra = extra_for_module(e.name) if builtin else None
            if extra:  # a module of an optional extra the kind imports at load time
                hint = f"tool kind {name!r} needs: {install_hint(extra)}"
                return _broken(name, source, dist, hint, message=hint)
            return _broken(name, source, dist, f"{type(e).__name__}: {e}")
        except Exception as e:  # noqa: BLE001 - any import failure of a plugin must not break the others
            return _broken(name, source, dist, f"{type(e).__name__}: {e}")
        if name not in _REGISTRY:
            if isinstance(obj, ToolKind):
                _REGISTRY[name] = obj
            elif callable(obj):
                register_tool(name, obj)
            else:
                return _broken(
                    name, source, dist, f"{type(obj).__name__} is neither a tool function nor a ToolKind"
                )
        return _REGISTRY[name]


def missing_extra(name: str) -> str | None:
    """The install hint when ``name`` is a kind of this package whose optional extra is not installed
    (checked on sys.path, nothing imported), else None. Validation reports it like an unknown kind."""
    if name not in _MISSING:
        hint = missing_kind_extra(name)
        _MISSING[name] = hint if hint and name not in _REGISTRY and name in BUILTIN_KINDS else None
    return _MISSING[name]


def is_known(name: str) -> bool:
    """Whether ``name`` can be used; the entry points are scanned only for a name not built in."""
    return name in _REGISTRY or name in BUILTIN_KINDS or name in _entry_points()


def registry_generation() -> int:
    """How many times a kind was replaced in this process (part of the parsed-playbook cache key; a new
    kind needs no bump: a playbook naming it was invalid before, and invalid ones are not kept)."""
    return _GENERATION[0]


def known_kinds() -> set[str]:
    """Every kind name that can be used, without importing any tool module."""
    return set(_REGISTRY) | set(BUILTIN_KINDS) | set(_entry_points())


def builtin_kinds() -> set[str]:
    """The kinds this package declares (its own entry points)."""
    return set(BUILTIN_KINDS)


def all_kinds() -> list[ToolKind]:
    """Every kind, loaded (broken plugins included, with their error), sorted by name."""
    out = []
    for name in sorted(known_kinds()):
        tk = get_tool(name)
        if tk is not None:
            out.append(tk)
    return out


def required_keys(name: str) -> list[str]:
    """Config keys the kind's model requires (by the name a playbook writes); built-ins of this
    package declare none, so validating them imports nothing."""
    if name not in _REGISTRY and name in _RAW_KEY_HINTS and name in BUILTIN_KINDS:
        return []
    tk = get_tool(name)
    if tk is None or tk.config is None:
        return []
    return [f.alias or n for n, f in tk.config.model_fields.items() if f.is_required()]


def raw_keys(name: str) -> frozenset[str]:
    """Config keys a kind takes verbatim (never rendered); built-ins answer without an import."""
    if name in _REGISTRY:
        return _REGISTRY[name].raw_keys
    if name in _RAW_KEY_HINTS and name in BUILTIN_KINDS:
        return _RAW_KEY_HINTS[name]
    tk = get_tool(name)
    return tk.raw_keys if tk else frozenset()
