"""The keychain: credentials and secrets of one execution.

Two ways in, both resolved lazily and cached for the execution:

* root ``keychain:`` declarations, read in templates as
  ``{{ keychain.<name>.<field> }}``;
* ``auth:`` names on tools (``ctx.credential(name)``), which first match a
  declaration and otherwise ask the providers for a stored credential record.

Providers, asked in order (the first that knows a name wins):

1. :class:`EnvProvider` — ``NOETL_CREDENTIAL_<NAME>`` holding a JSON record, or
   one variable per field, ``NOETL_CREDENTIAL_<NAME>_<FIELD>``. ``<NAME>`` is the
   credential name upper-cased with every non-alphanumeric character as ``_``.
   Secrets of ``kind: secrets`` declarations with ``provider: env`` are read
   from the variable the ``map`` names.
2. :class:`FileProvider` — a YAML/JSON credentials file (``NOETL_CREDENTIALS_FILE``,
   else ``$NOETL_DAGSTER_HOME/credentials.yaml``, else ``./.noetl/credentials.yaml``)
   or a directory of such files. It accepts ``{credentials: {name: record},
   secrets: {ref: value}}``, a bare ``{name: record}`` mapping, a list of records
   with ``name``, or one record with ``name`` (the NoETL e2e credential shape
   ``{name, type, data: {db_host, db_port, db_user, db_password, db_name}}``).
3. Plug-ins: entry points in the ``noetl_dagster.keychain_providers`` group
   naming a :class:`KeychainProvider` subclass or a zero-argument factory.

A record ``{type, data: {...}}`` is returned flat: ``{"type": ..., **data}``.
Every resolved secret string is remembered (:meth:`Keychain.secret_values`) and
pushed to the ``on_secret`` callbacks the moment it is resolved, so the engine's
redactor scrubs it from events, logs, errors and output. The engine attaches an
execution with :meth:`Keychain.bind` (render names, renderer, redactor).

This module must stay free of Dagster imports.
"""

from __future__ import annotations

import functools
import json
import os
import re
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

ENTRY_POINT_GROUP = "noetl_dagster.keychain_providers"
ENV_PREFIX = "NOETL_CREDENTIAL_"

# Field names whose values are secret wherever they appear (static maps, stored records).
SECRET_FIELD = re.compile(
    r"pass(word|wd|phrase)?|pwd|secret|token|api[_-]?key|apikey|private[_-]?key|access[_-]?key"
    r"|signing[_-]?key|credential|signature|cookie|session|bearer",
    re.IGNORECASE,
)
# Fields that may embed a password (``scheme://user:password@host``).
URL_FIELDS = ("dsn", "url", "uri", "connection_string", "conninfo", "database_url")
# Shorter strings are not scrubbed: replacing 1–2 characters everywhere would mangle every event.
MIN_SECRET_LENGTH = 3


class KeychainError(RuntimeError):
    """A credential could not be resolved. Messages never contain secret values."""


class UnknownCredential(KeychainError, KeyError):
    """No declaration and no provider knows this name."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else "unknown credential"


def env_name(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9]", "_", name).upper()


def flatten_record(record: Mapping[str, Any]) -> dict[str, Any]:
    """``{type, data: {...}, ...}`` → ``{type, **data, ...}``; other shapes are copied."""
    out = {k: v for k, v in record.items() if k not in ("data", "name", "description")}
    data = record.get("data")
    if isinstance(data, Mapping):
        out.update(data)
    elif data is not None:
        out["data"] = data
    return out


class KeychainProvider:
    """Plug-in interface. Override what the provider can do; the defaults decline."""

    name = "provider"

    def credential(self, name: str) -> dict[str, Any] | None:
        """The stored record called ``name`` (flat dict), or None when unknown here."""
        return None

    def secret(self, ref: str, *, provider: str | None = None, auth: str | None = None) -> str | None:
        """The secret value at ``ref`` for a ``kind: secrets`` declaration, or None.
        ``auth`` names the credential the declaration gave for reaching the secret store."""
        return None

    def resolve(self, declaration: Mapping[str, Any], keychain: Keychain) -> dict[str, Any] | None:
        """Fields for a declaration of a kind the keychain does not know, or None."""
        return None

    def describe(self) -> str:
        return self.name


class EnvProvider(KeychainProvider):
    name = "env"

    def __init__(self, environ: Mapping[str, str] | None = None):
        self.environ = os.environ if environ is None else environ

    def credential(self, name: str) -> dict[str, Any] | None:
        key = ENV_PREFIX + env_name(name)
        raw = self.environ.get(key)
        if raw is not None:
            try:
                value = json.loads(raw)
            except json.JSONDecodeError as e:
                raise KeychainError(f"{key} is not valid JSON ({e.msg} at char {e.pos})") from None
            if not isinstance(value, Mapping):
                raise KeychainError(f"{key} must hold a JSON object, got {type(value).__name__}")
            return flatten_record(value)
        prefix = key + "_"
        fields = {k[len(prefix) :].lower(): v for k, v in self.environ.items() if k.startswith(prefix)}
        return fields or None

    def secret(self, ref: str, *, provider: str | None = None, auth: str | None = None) -> str | None:
        if provider in ("env", "environment"):
            return self.environ.get(ref)
        return self.environ.get("NOETL_SECRET_" + env_name(ref))

    def describe(self) -> str:
        return f"env ({ENV_PREFIX}<NAME>[_<FIELD>])"


def default_credentials_path() -> Path:
    explicit = os.environ.get("NOETL_CREDENTIALS_FILE")
    if explicit:
        return Path(explicit)
    return Path(os.environ.get("NOETL_DAGSTER_HOME", ".noetl")) / "credentials.yaml"


class FileProvider(KeychainProvider):
    name = "file"

    def __init__(self, path: str | os.PathLike[str] | None = None):
        self.path = Path(path) if path is not None else default_credentials_path()
        self._loaded: tuple[dict[str, dict[str, Any]], dict[str, str]] | None = None
        self._lock = threading.Lock()

    def _load(self) -> tuple[dict[str, dict[str, Any]], dict[str, str]]:
        with self._lock:
            if self._loaded is None:
                creds: dict[str, dict[str, Any]] = {}
                secrets: dict[str, str] = {}
                if self.path.is_dir():
                    files = sorted(p for p in self.path.iterdir() if p.suffix in (".json", ".yaml", ".yml"))
                else:
                    files = [self.path] if self.path.exists() else []
                for f in files:
                    self._read_file(f, creds, secrets)
                self._loaded = (creds, secrets)
            return self._loaded

    @staticmethod
    def _read_file(path: Path, creds: dict[str, dict[str, Any]], secrets: dict[str, str]) -> None:
        from noetl_dagster.dsl.loader import YamlFileError, YamlSyntaxError, load_yaml_file  # noqa: PLC0415

        try:  # the bounded reader and the YAML limits of every other file (a FIFO would hang the run)
            doc, _ = load_yaml_file(path, what="credentials file")
        except YamlFileError as e:
            raise KeychainError(str(e)) from None
        except YamlSyntaxError as e:  # never the text itself: it holds secrets
            raise KeychainError(
                f"credentials file {path}:{e.line} is not valid YAML/JSON ({e.rule})"
            ) from None
        if doc is None:
            return

        def add(name: Any, record: Any) -> None:
            if not isinstance(record, Mapping):
                raise KeychainError(f"credentials file {path}: entry {name!r} must be a mapping")
            creds[str(name)] = flatten_record(record)

        if isinstance(doc, list):
            for i, rec in enumerate(doc):
                if not isinstance(rec, Mapping) or "name" not in rec:
                    raise KeychainError(f"credentials file {path}: list item {i} needs a 'name'")
                add(rec["name"], rec)
        elif isinstance(doc, Mapping):
            if "credentials" in doc or "secrets" in doc:
                block = doc.get("credentials") or {}
                if isinstance(block, list):
                    for rec in block:
                        add(rec.get("name"), rec)
                else:
                    for n, rec in block.items():
                        add(n, rec)
                for ref, value in (doc.get("secrets") or {}).items():
                    secrets[str(ref)] = str(value)
            elif "name" in doc and ("type" in doc or "data" in doc):
                add(doc["name"], doc)
            elif "type" in doc and "data" in doc:  # one record per file, named by the file
                add(path.stem, doc)
            else:
                for n, rec in doc.items():
                    add(n, rec)
        else:
            raise KeychainError(f"credentials file {path} must hold a mapping or a list")

    def credential(self, name: str) -> dict[str, Any] | None:
        rec = self._load()[0].get(name)
        return dict(rec) if rec is not None else None

    def secret(self, ref: str, *, provider: str | None = None, auth: str | None = None) -> str | None:
        return self._load()[1].get(ref)

    def describe(self) -> str:
        return f"file {self.path}"


@functools.lru_cache(maxsize=4)
def _plugin_entry_points(path: tuple[str, ...]) -> tuple[Any, ...]:
    """Scanning installed distributions costs milliseconds: once per ``sys.path``."""
    return tuple(entry_points(group=ENTRY_POINT_GROUP))


def plugin_providers() -> list[KeychainProvider]:
    import sys

    out: list[KeychainProvider] = []
    for ep in _plugin_entry_points(tuple(sys.path)):
        obj = ep.load()
        provider = obj() if callable(obj) else obj
        if not isinstance(provider, KeychainProvider):
            raise KeychainError(f"keychain provider plug-in {ep.name!r} did not produce a KeychainProvider")
        out.append(provider)
    return out


def default_providers() -> list[KeychainProvider]:
    return [EnvProvider(), FileProvider(), *plugin_providers()]


def _default_render(value: Any, names: Mapping[str, Any]) -> Any:
    """Render ``{{ }}`` templates inside ``value`` (used when the engine gives no renderer):
    through the one template gate (:func:`~noetl_dagster.dsl.templates.template_env`), so a
    declaration's template gets the same sandbox and the same time/work/size limits as any
    other template (issue 29.2), never a renderer of its own."""
    from noetl_dagster.dsl.templates import template_env  # noqa: PLC0415 - jinja2 loads on first use

    return template_env().render(value, names)


def secrets_in_url(value: str) -> list[str]:
    try:
        parts = urlsplit(value)
    except ValueError:
        return []
    return [parts.password] if parts.password else []


class _Namespace(Mapping[str, Any]):
    """``keychain`` in templates: resolves an entry on first access."""

    def __init__(self, keychain: Keychain):
        self._kc = keychain

    def __getitem__(self, name: str) -> dict[str, Any]:
        # a template reads only what the playbook declares (issue 14.6): an undeclared name never
        # reaches the providers (NOETL_CREDENTIAL_* variables, the credentials file)
        if name not in self._kc.declared:
            raise UnknownCredential(f"keychain.{name}: not declared under the playbook's keychain:")
        return self._kc.credential(name)

    def __iter__(self) -> Iterator[str]:
        return iter(self._kc.declared)

    def __len__(self) -> int:
        return len(self._kc.declared)

    def __contains__(self, name: object) -> bool:
        return name in self._kc.declared

    def __repr__(self) -> str:  # never show resolved values
        return f"<keychain {sorted(self._kc.declared)}>"


class Keychain:
    """Credentials of one execution; see the module docstring for the sources."""

    def __init__(
        self,
        declarations: list[dict[str, Any]] | None,
        *,
        providers: list[KeychainProvider] | None = None,
        base_dir: str | None = None,
        context: Mapping[str, Any] | Callable[[], Mapping[str, Any]] | None = None,
        render: Callable[[Any, Mapping[str, Any]], Any] | None = None,
        on_secret: Callable[[Iterable[str]], None] | None = None,
        http_timeout: float = 30.0,
    ):
        self.declared: dict[str, dict[str, Any]] = {}
        for i, decl in enumerate(declarations or []):
            if not isinstance(decl, Mapping) or not decl.get("name"):
                raise KeychainError(f"keychain[{i}]: each entry needs a 'name'")
            self.declared[str(decl["name"])] = dict(decl)
        self.providers = default_providers() if providers is None else list(providers)
        self.base_dir = base_dir
        self.http_timeout = http_timeout
        self._context: Mapping[str, Any] | Callable[[], Mapping[str, Any]] = context or {}
        self._render = render or _default_render
        self._on_secret: list[Callable[[Iterable[str]], None]] = [on_secret] if on_secret else []
        self._cache: dict[str, tuple[dict[str, Any], float | None]] = {}
        self._secrets: set[str] = set()
        self._resolving: list[str] = []
        self._lock = threading.RLock()

    def bind(
        self,
        *,
        context: Mapping[str, Any] | Callable[[], Mapping[str, Any]] | None = None,
        render: Callable[[Any, Mapping[str, Any]], Any] | None = None,
        on_secret: Callable[[Iterable[str]], None] | None = None,
    ) -> Keychain:
        """Attach an execution: the names declarations render with (a mapping, or a
        callable returning one at resolution time), its template renderer, and a
        callback told of every secret as it is resolved (the event redactor)."""
        if context is not None:
            self._context = context
        if render is not None:
            self._render = render
        if on_secret is not None:
            self._on_secret.append(on_secret)
            known = self.secret_values()
            if known:
                on_secret(known)
        return self

    @property
    def context(self) -> Mapping[str, Any]:
        ctx = self._context() if callable(self._context) else self._context
        return ctx or {}

    # ---- public API -------------------------------------------------------------------------

    def namespace(self) -> Mapping[str, Any]:
        return _Namespace(self)

    def credential(self, name: str) -> dict[str, Any]:
        """The fields of ``name``: a declaration, else a provider's stored record."""
        if not isinstance(name, str) or not name:
            raise UnknownCredential(f"credential name must be a non-empty string, got {name!r}")
        with self._lock:
            cached = self._cache.get(name)
            if cached is not None and (cached[1] is None or cached[1] > time.time()):
                return dict(cached[0])
            if name in self._resolving:
                chain = " -> ".join([*self._resolving, name])
                raise KeychainError(f"keychain entries refer to each other in a cycle: {chain}")
            self._resolving.append(name)
            try:
                if name in self.declared:
                    fields, expires = self._resolve_declaration(self.declared[name])
                else:
                    fields, expires = self._stored(name), None
            finally:
                self._resolving.pop()
            self._cache[name] = (fields, expires)
            return dict(fields)

    def secret_values(self) -> set[str]:
        with self._lock:
            return {s for s in self._secrets if len(s) >= MIN_SECRET_LENGTH}

    def add_secret(self, value: Any) -> None:
        """Remember a value to scrub (used by ``ctx.redact``)."""
        if isinstance(value, str) and value:
            self._publish({value})

    # ---- resolution -------------------------------------------------------------------------

    def _stored(self, name: str) -> dict[str, Any]:
        for p in self.providers:
            rec = p.credential(name)
            if rec is not None:
                self._remember(rec, all_secret=False)
                return rec
        where = ", ".join(p.describe() for p in self.providers) or "no providers configured"
        raise UnknownCredential(
            f"unknown credential {name!r}: not declared under keychain: and not found in {where}"
        )

    def _names(self) -> dict[str, Any]:
        ctx = self.context
        return {**ctx, "workload": ctx.get("workload", ctx), "keychain": self.namespace()}

    def _resolve_declaration(self, decl: Mapping[str, Any]) -> tuple[dict[str, Any], float | None]:
        name = decl["name"]
        kind = str(decl.get("kind") or decl.get("type") or "static").lower()
        body = {
            k: v for k, v in decl.items() if k not in ("name", "kind", "type", "scope", "auto_renew", "desc")
        }
        try:
            body = self._render(body, self._names())
        except KeychainError:
            raise
        except Exception as e:
            raise KeychainError(
                f"keychain {name!r}: rendering its fields failed: {type(e).__name__}: {e}"
            ) from None

        if kind in ("static", "map"):
            fields = dict(body.get("map") or {k: v for k, v in body.items() if k != "map"})
            self._remember(fields, all_secret=False)
            return fields, None
        if kind == "bearer":
            token = body.get("token") or body.get("access_token")
            if not token:
                raise KeychainError(f"keychain {name!r} (bearer): 'token' is empty")
            self._remember({"token": token}, all_secret=True)
            return {"type": "bearer", "token": token, "access_token": token, "api_key": token}, None
        if kind == "basic":
            user = body.get("username") or body.get("user")
            pw = body.get("password")
            if user is None or pw is None:
                raise KeychainError(f"keychain {name!r} (basic): needs 'username' and 'password'")
            self._remember({"password": pw}, all_secret=True)
            return {"type": "basic", "username": user, "password": pw}, None
        if kind in ("header", "api_key"):
            header = body.get("header") or body.get("header_name") or "X-API-Key"
            value = body.get("value") or body.get("token") or body.get("api_key")
            if not value:
                raise KeychainError(f"keychain {name!r} ({kind}): 'value' is empty")
            self._remember({"value": value}, all_secret=True)
            return {"type": "header", "header": header, "value": value}, None
        if kind == "credential":
            ref = body.get("credential") or body.get("auth")
            if not ref:
                raise KeychainError(f"keychain {name!r} (credential): needs 'credential: <name>'")
            return self._stored(str(ref)), None
        if kind == "secrets":
            return self._resolve_secrets(name, body), None
        if kind == "oauth2":
            return self._resolve_oauth2(name, body)
        for p in self.providers:
            fields = p.resolve(decl, self)
            if fields is not None:
                self._remember(fields, all_secret=False)
                return dict(fields), None
        raise KeychainError(
            f"keychain {name!r}: kind {kind!r} is not supported here "
            "(built in: static, bearer, basic, header, credential, secrets, oauth2; more via the "
            f"{ENTRY_POINT_GROUP!r} plug-in group)"
        )

    def _resolve_secrets(self, name: str, body: Mapping[str, Any]) -> dict[str, Any]:
        provider = body.get("provider")
        auth = str(body["auth"]) if body.get("auth") else None
        refs = body.get("map")
        if not isinstance(refs, Mapping):
            single = body.get("secret") or body.get("ref") or body.get("key")
            if not single:
                raise KeychainError(f"keychain {name!r} (secrets): needs 'map: {{field: secret ref}}'")
            refs = {"value": single}
        fields: dict[str, Any] = {}
        for field_name, ref in refs.items():
            value = None
            for p in self.providers:
                value = p.secret(str(ref), provider=provider, auth=auth)
                if value is not None:
                    break
            if value is None:
                where = ", ".join(p.describe() for p in self.providers) or "no providers configured"
                raise KeychainError(
                    f"keychain {name!r} (secrets, provider {provider or 'any'}): secret for field "
                    f"{field_name!r} not found (asked {where})"
                )
            fields[field_name] = value
        self._remember(fields, all_secret=True)
        return fields

    def _resolve_oauth2(self, name: str, body: Mapping[str, Any]) -> tuple[dict[str, Any], float | None]:
        import httpx  # noqa: PLC0415

        endpoint = body.get("endpoint") or body.get("token_url") or body.get("url")
        if not endpoint:
            raise KeychainError(f"keychain {name!r} (oauth2): needs 'endpoint'")
        method = str(body.get("method") or "POST").upper()
        headers = {str(k): str(v) for k, v in (body.get("headers") or {}).items()}
        form = body.get("data")
        payload = body.get("json")
        if form is not None:
            self._remember(form if isinstance(form, Mapping) else {}, all_secret=False)
        try:
            resp = httpx.request(
                method, str(endpoint), headers=headers, data=form, json=payload, timeout=self.http_timeout
            )
        except httpx.HTTPError as e:
            raise KeychainError(
                f"keychain {name!r} (oauth2): token request failed: {type(e).__name__}"
            ) from None
        if resp.status_code // 100 != 2:
            raise KeychainError(
                f"keychain {name!r} (oauth2): token endpoint answered HTTP {resp.status_code}"
            )
        try:
            fields = resp.json()
        except ValueError:
            raise KeychainError(f"keychain {name!r} (oauth2): token endpoint did not return JSON") from None
        if not isinstance(fields, Mapping) or not fields.get("access_token"):
            raise KeychainError(f"keychain {name!r} (oauth2): response has no access_token")
        fields = dict(fields)
        self._remember({k: v for k, v in fields.items() if SECRET_FIELD.search(k)}, all_secret=True)
        expires = None
        try:
            # renew a little early so a token never expires mid-request
            expires = time.time() + max(0.0, float(fields["expires_in"]) - 30)
        except (KeyError, TypeError, ValueError):
            pass
        return fields, expires

    def _remember(self, fields: Mapping[str, Any], *, all_secret: bool) -> None:
        found: set[str] = set()
        self._collect(fields, all_secret, found)
        self._publish(found)

    def _collect(self, fields: Mapping[str, Any], all_secret: bool, found: set[str]) -> None:
        for k, v in fields.items():
            if isinstance(v, Mapping):
                self._collect(v, all_secret, found)
            elif isinstance(v, str) and v:
                if all_secret or SECRET_FIELD.search(str(k)):
                    found.add(v)
                elif str(k).lower() in URL_FIELDS:
                    found.update(secrets_in_url(v))

    def _publish(self, values: set[str]) -> None:
        with self._lock:
            new = {v for v in values if v not in self._secrets}
            self._secrets.update(new)
        new = {v for v in new if len(v) >= MIN_SECRET_LENGTH}
        if new:
            for callback in self._on_secret:
                callback(new)
