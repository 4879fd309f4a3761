"""The trust boundary of generated (inline) playbooks.

A playbook handed to ``kind: playbook`` as an inline ``definition`` (typically
produced by an earlier step, e.g. an agent) runs as a child execution that does
**not** inherit its parent's credentials or tool kinds. It gets only:

* the tool kinds its parent's ``executor.spec.generated.allow_kinds`` lists, and
* the keychain names the calling task passes in ``credentials:`` that its
  parent's ``executor.spec.generated.allow_credentials`` also lists, and
* the network hosts its parent's ``executor.spec.generated.allow_hosts`` lists
  (``host``, ``host:port`` or ``*.domain``): every http(s) URL it requests.

No ``executor.spec.generated`` means nothing is allowed. A restricted execution
passes its restriction on: its own children (inline or from the catalog) are
checked against it and can only narrow it. Credentials of a restricted child
resolve through the parent's keychain under the delegated names only
(:class:`DelegatedKeychain`); every secret so resolved is redacted from the
child's events as well as the parent's.
"""

from __future__ import annotations

import ipaddress
import os
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote, urlsplit

from noetl_dagster.dsl.locator import tenants_named
from noetl_dagster.engine.ports import ToolError

if TYPE_CHECKING:
    from noetl_dagster.dsl.model import Playbook, Task

_KEYCHAIN_REF = re.compile(r"keychain\s*(?:\.\s*([A-Za-z_]\w*)|\[\s*['\"]([^'\"]+)['\"]\s*\])")
_CREDENTIAL_KEYS = ("auth", "credential", "credentials")


@dataclass(frozen=True)
class Grant:
    """What an execution may use. ``None`` = unrestricted (a catalog or CLI execution)."""

    kinds: frozenset[str] | None = None
    credentials: frozenset[str] | None = None
    hosts: frozenset[str] | None = None  # ``host``, ``host:port`` or ``*.domain`` entries, lower case

    @property
    def restricted(self) -> bool:
        return self.kinds is not None or self.credentials is not None or self.hosts is not None

    def narrow(self, other: Grant) -> Grant:
        def meet(a: frozenset[str] | None, b: frozenset[str] | None) -> frozenset[str] | None:
            return b if a is None else a if b is None else a & b

        return Grant(
            meet(self.kinds, other.kinds),
            meet(self.credentials, other.credentials),
            meet(self.hosts, other.hosts),
        )


UNRESTRICTED = Grant()


def generated_policy(pb: Playbook) -> Grant:
    """``executor.spec.generated: {allow_kinds, allow_credentials, allow_hosts}`` (lists); absent = nothing."""
    spec = pb.executor.spec.get("generated") if pb.executor else None
    spec = spec if isinstance(spec, Mapping) else {}

    def names(key: str) -> frozenset[str]:
        v = spec.get(key) or []
        return frozenset(str(x) for x in v) if isinstance(v, (list, tuple)) else frozenset()

    hosts = frozenset(h.strip().lower() for h in names("allow_hosts") if h.strip())
    return Grant(names("allow_kinds"), names("allow_credentials"), hosts)


SANDBOX_POLICY_ENV = "NOETL_SANDBOX"


def isolation(pb: Playbook, tenant: str, project: str) -> str | None:
    """``"sandbox"`` when the execution's tool code (python, shell, script, an MCP stdio server) runs in
    the OS sandbox (tools/sandbox.py) although it is not generated: the operator's tenant/project
    policy ``NOETL_SANDBOX`` (comma-separated ``*``, ``<tenant>`` or ``<tenant>/<project>``) names it,
    or the playbook asks itself with ``executor.spec.isolation: sandbox``."""
    own = pb.executor.spec.get("isolation") if pb.executor else None
    policy = {s.strip() for s in os.environ.get(SANDBOX_POLICY_ENV, "").split(",") if s.strip()}
    if own == "sandbox" or policy & {"*", tenant, f"{tenant}/{project}"}:
        return "sandbox"
    return None


def grant_for_generated(parent: Grant, parent_pb: Playbook, passed: Iterable[str] | None) -> Grant:
    """The grant of an inline child: kinds allowed by the parent's policy (within the parent's own
    grant), credentials passed explicitly by the call and allowed by that policy."""
    policy = parent.narrow(generated_policy(parent_pb))
    passed_set = frozenset(str(c) for c in (passed or []))
    allowed = policy.credentials if policy.credentials is not None else frozenset()
    refused = sorted(passed_set - allowed)
    if refused:
        raise ToolError(
            f"generated playbook refused: credentials {refused} are passed but not allowed by the parent's "
            f"executor.spec.generated.allow_credentials ({sorted(allowed)})",
            kind="generated_playbook_refused",
            result={"violations": [f"credential {c!r} is not in allow_credentials" for c in refused]},
        )
    return Grant(policy.kinds, passed_set, policy.hosts)


def _tasks(pb: Playbook) -> Iterator[tuple[str, Task]]:
    for step in pb.workflow:
        for t in step.tool:
            yield f"workflow step {step.name!r} task {t.label!r}", t
    for w in pb.workbook:
        yield f"workbook entry {w.name!r}", w.tool


def _cursors(pb: Playbook) -> Iterator[tuple[str, Any]]:
    loops = [
        (f"workflow step {s.name!r}", lp) for s in pb.workflow for lp in (s.loop, *(t.loop for t in s.tool))
    ]
    loops += [(f"workbook entry {w.name!r}", w.tool.loop) for w in pb.workbook]
    for where, loop in loops:
        if loop is not None and loop.cursor is not None:
            yield f"{where} loop.cursor", loop.cursor


def _strings(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, Mapping):
        for k, v in value.items():
            yield from _strings(k)
            yield from _strings(v)
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _strings(v)


def _credential_refs(value: Any, out: set[str]) -> set[str]:
    """Literal credential names under ``auth`` / ``credential`` keys (nested mappings too)."""
    if isinstance(value, Mapping):
        for k, v in value.items():
            if k in _CREDENTIAL_KEYS:
                if isinstance(v, str) and "{{" not in v:
                    out.add(v)
                elif isinstance(v, (list, tuple)):
                    out.update(x for x in v if isinstance(x, str) and "{{" not in x)
                elif isinstance(v, Mapping):
                    for kk in ("name", "credential", "key", *_ROLE_KEYS):
                        if isinstance(v.get(kk), str) and "{{" not in v[kk]:
                            out.add(v[kk])
            _credential_refs(v, out)
    elif isinstance(value, (list, tuple)):
        for v in value:
            _credential_refs(v, out)
    return out


_URL_SCHEMES = ("http://", "https://", "ws://", "wss://")
_ROLE_KEYS = ("sf", "pg")  # snowflake_transfer's auth roles (_AUTH_ROLES below)


def _urls(kind: str, config: Mapping[str, Any]) -> Iterator[str]:
    """Literal network URLs a task names outside its data (``url``/``endpoint`` of ``kind: http``)."""
    if kind == "http":
        for key in ("url", "endpoint"):
            v = config.get(key)
            if isinstance(v, str) and v.strip() and "{{" not in v and "{%" not in v:
                yield v
    for key, v in config.items():
        if str(key).lower() not in _DATA_KEYS and not (kind == "http" and key in ("url", "endpoint")):
            for text in _strings(v):
                if text.strip().lower().startswith(_URL_SCHEMES) and "{{" not in text:
                    yield text


def host_refusal(url: str, hosts: frozenset[str]) -> str | None:
    """Why ``url`` is outside ``allow_hosts`` (None when its host is listed): an entry ``host`` allows
    every port of that host, ``host:port`` that port (default ports count: 80, 443), ``*.domain``
    every subdomain of ``domain``. Hosts compare lower case, as written (no DNS resolution)."""
    text = url.strip()
    try:
        parts = urlsplit(text)
        scheme, host, port = parts.scheme.lower(), (parts.hostname or "").lower(), parts.port
    except ValueError:  # a bad port, an unbalanced [
        scheme, host, port = "", "", None
    if scheme not in ("http", "https", "ws", "wss") or not host:
        return f"{text[:200]!r} is not an http(s) URL with a host (allow_hosts: {sorted(hosts)})"
    shown = f"{host}:{port}" if port else host
    port = port or (443 if scheme in ("https", "wss") else 80)
    host = _host_name(host)
    for entry in hosts:
        try:
            e = urlsplit("//" + entry)
            e_host, e_port = _host_name(e.hostname or ""), e.port
        except ValueError:
            continue
        if e_port is not None and e_port != port:
            continue
        if e_host == host or (e_host.startswith("*.") and host.endswith(e_host[1:])):
            return None
    return f"host {shown!r} is not in allow_hosts ({sorted(hosts)})"


def resolve_checked(host: str, port: int) -> tuple[tuple[str, int], str | None]:
    """The address to connect to, or why not: a *name* that resolves to a loopback, link-local or
    unspecified address (the worker's own services, a cloud metadata endpoint such as 169.254.169.254)
    is refused; an address written as such is what the grant lists. OSError when it does not resolve."""
    try:
        literal = ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        literal = None
    import socket  # noqa: PLC0415 - only where a host is checked (issue 35: a run imports no socket)

    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    for *_, sockaddr in infos:
        ip = ipaddress.ip_address(str(sockaddr[0]).split("%")[0])
        if literal is None and (ip.is_loopback or ip.is_link_local or ip.is_unspecified):
            return ("", 0), f"host {host!r} resolves to {ip} (loopback/link-local: name the address itself)"
    return (str(infos[0][4][0]), port), None


def _host_name(host: str) -> str:
    """Lower case, no trailing dot, an internationalized name in its ASCII (punycode) form."""
    host = host.lower().rstrip(".")
    if not host.isascii():
        try:
            host = host.encode("idna").decode("ascii")
        except UnicodeError:
            pass
    return host


def violations(pb: Playbook, grant: Grant, tenant: str | None = None) -> list[str]:
    """Everything in ``pb`` the grant does not allow (empty when it may run). With ``tenant`` (the
    execution's), a literal ``noetl://<other tenant>/…`` resource anywhere in the playbook is refused too:
    a restricted child works in its parent's tenant only (run-time URIs meet the registry's own checks)."""
    out: list[str] = []
    if tenant is not None:
        seen: set[str] = set()
        for text in _strings(pb.model_dump(mode="json", exclude={"source_file"})):
            for other in tenants_named(text):
                if other != tenant and other not in seen:
                    seen.add(other)
                    out.append(f"resource noetl://{other}/… belongs to tenant {other!r}, not this "
                               f"execution's tenant {tenant!r} (cross-tenant resources are refused)")  # fmt: skip
    if grant.kinds is not None:
        for where, t in _tasks(pb):
            if t.kind not in grant.kinds:
                out.append(
                    f"{where}: tool kind {t.kind!r} is not allowed (allow_kinds: {sorted(grant.kinds)})"
                )
        for where, cur in _cursors(pb):
            kind = CURSOR_TOOL_KIND.get(cur.kind, cur.kind)
            if kind not in grant.kinds:
                out.append(
                    f"{where}: cursor kind {cur.kind!r} is not allowed (allow_kinds: {sorted(grant.kinds)})"
                )
    if grant.hosts is not None:
        for where, t in _tasks(pb):
            for text in _urls(t.kind, t.config):
                why = host_refusal(text, grant.hosts)
                if why:
                    out.append(f"{where}: {why}")
    if grant.credentials is not None:
        asked: dict[str, str] = {}
        for decl in pb.keychain:
            asked.setdefault(str(decl.get("name")), "keychain declaration")
        for where, t in _tasks(pb):
            for name in _credential_refs(t.config, set()):
                asked.setdefault(name, f"{where} (auth)")
        for where, cur in _cursors(pb):
            if cur.kind != "duckdb" and isinstance(cur.auth, str) and "{{" not in cur.auth:
                asked.setdefault(cur.auth, f"{where} (auth)")
        for text in _strings(pb.model_dump(mode="json", exclude={"source_file"})):
            for m in _KEYCHAIN_REF.finditer(text):
                asked.setdefault(m.group(1) or m.group(2), "template reference")
        for name, where in asked.items():
            if name not in grant.credentials:
                out.append(f"credential {name!r} ({where}) is not passed to this playbook "
                           f"(delegated: {sorted(grant.credentials)})")  # fmt: skip
    return out


class DelegatedKeychain:
    """The keychain of a restricted child: only the delegated names, resolved by the parent."""

    def __init__(self, resolve: Callable[[str], dict[str, Any]], secrets: Callable[[], Iterable[str]],
                 names: frozenset[str]):  # fmt: skip
        self._resolve = resolve
        self._secrets = secrets
        self.names = names
        self._on_secret: list[Callable[[Iterable[str]], None]] = []

    def bind(
        self, *, on_secret: Callable[[Iterable[str]], None] | None = None, **_: Any
    ) -> DelegatedKeychain:
        if on_secret is not None:
            self._on_secret.append(on_secret)
            on_secret(set(self._secrets()))
        return self

    def credential(self, name: str) -> dict[str, Any]:
        if name not in self.names:
            raise ToolError(
                f"credential {name!r} is not delegated to this generated playbook (delegated: {sorted(self.names)})",
                kind="credential_not_delegated",
            )
        fields = self._resolve(name)
        known = set(self._secrets())
        for cb in self._on_secret:
            cb(known)
        return fields

    def secret_values(self) -> set[str]:
        return set(self._secrets())

    def namespace(self) -> Mapping[str, Any]:
        return _DelegatedNamespace(self)


class _DelegatedNamespace(Mapping[str, Any]):
    def __init__(self, kc: DelegatedKeychain):
        self._kc = kc

    def __getitem__(self, name: str) -> dict[str, Any]:
        if name not in self._kc.names:
            raise KeyError(name)
        return self._kc.credential(name)

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(self._kc.names))

    def __len__(self) -> int:
        return len(self._kc.names)

    def __repr__(self) -> str:  # never show resolved values
        return f"<delegated keychain {sorted(self._kc.names)}>"


# -- the run-time gate ---------------------------------------------------------------------------
# Every tool call, loop.cursor driver and sub-playbook launch of a restricted execution passes
# Gate.check with its rendered config, whatever part of the DSL asked for it (a workflow task, a
# workbook entry, a task loop, a cursor): the static walk above is only the early, friendly refusal.

TRUST_REFUSED = "trust_refused"
# the values tools read as data (SQL, code, bodies, rows): never a credential or a resource of the worker
_DATA_KEYS = frozenset({
    "input", "args", "data", "payload", "body", "json", "json_", "params", "rows", "value", "literal",
    "literal_b64", "result", "vectors", "vector", "text", "stdin", "env", "headers", "filter", "metadata",
    "code", "code_b64", "code_base64", "command", "commands", "query", "sql", "claim", "ack", "fail",
    "heartbeat", "definition", "arguments", "tokens", "order", "merge", "interpreter", "working_dir",
})  # fmt: skip
# inline connection material: a credential the grant never delegated
_INLINE_SECRET_KEYS = frozenset({
    "dsn", "connection_string", "conninfo", "database_url", "password", "passwd", "api_key", "apikey",
    "token", "access_token", "client_secret", "private_key", "service_account", "service_account_info",
    "nats_url", "servers",
})  # fmt: skip
# another registry, object store or catalog than the execution's own (its tenant's)
_SCOPE_KEYS = frozenset({"registry", "store", "catalog"})
# kinds that open a connection: only through a delegated credential, never an inline target
_CONNECTING_KINDS = frozenset({"postgres", "snowflake", "nats", "gcs", "transfer", "snowflake_transfer"})
# kinds whose auth names one credential per role (``auth: {sf: <name>, pg: <name>}``): each a delegated name
_AUTH_ROLES = {"snowflake_transfer": frozenset(_ROLE_KEYS)}
_TARGET_KEYS = frozenset({"url", "endpoint", "server_url", "host", "db_host"})
# credential *names* a kind reads under other keys (the secrets tool)
_NAME_KEYS = {"secrets": ("name", "secret", "secret_name")}
# a cursor driver counts as its tool kind
CURSOR_TOOL_KIND = {"nats_stream": "nats"}
_USERINFO = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://[^/@\s]*@")
# URIs that name a local file, as the tools read them (kind: resource opens `file:/x`, kind: artifact
# `artifact://localfs/x`; both decode %-escapes): the prefix before the path
_LOCAL_URI = re.compile(r"^(?:file:(?://(?:localhost(?=/))?)?|artifact://(?:localfs)?)", re.IGNORECASE)


class Gate:
    """The grant of one restricted execution, checked at run time on every call it makes.

    ``scope_dir`` is the execution's own directory: local paths must stay inside it."""

    def __init__(self, grant: Grant, tenant: str, scope_dir: str):
        self.grant = grant
        self.tenant = tenant
        self.scope_dir = os.path.realpath(scope_dir)

    def _refuse(self, where: str, why: str, kind: str = TRUST_REFUSED) -> ToolError:
        return ToolError(
            f"generated playbook: {where}: {why}", kind=kind, result={"refused": why, "where": where}
        )

    def check(self, kind: str, config: Mapping[str, Any], where: str) -> None:
        """Raise ToolError unless ``kind`` with this rendered ``config`` is within the grant."""
        g = self.grant
        tool_kind = CURSOR_TOOL_KIND.get(kind, kind)
        if g.kinds is not None and tool_kind not in g.kinds:
            raise self._refuse(
                where, f"tool kind {tool_kind!r} is not allowed (allow_kinds: {sorted(g.kinds)})"
            )
        names: list[str] = []
        self._walk(tool_kind, config, where, names, top=True)
        for key in _NAME_KEYS.get(tool_kind, ()):
            if isinstance(config.get(key), str) and config[key]:
                names.append(config[key])
        for name in names:
            if g.credentials is not None and name not in g.credentials:
                raise self._refuse(where, f"credential {name!r} is not delegated to this generated playbook "
                                   f"(delegated: {sorted(g.credentials)})", kind="credential_not_delegated")  # fmt: skip
        if tool_kind in _CONNECTING_KINDS and not names:
            raise self._refuse(
                where, f"{tool_kind!r} connects only through a delegated credential (`auth: <name>`)"
            )
        if tool_kind == "http":  # the request URL, whatever else the walk saw
            for key in ("url", "endpoint"):
                if config.get(key) not in (None, ""):
                    self.url(str(config[key]), where)
                    break
            else:
                raise self._refuse(where, "an http call needs a 'url' on a host in allow_hosts")
        if tool_kind == "ducklake":
            self._ducklake(config, where)
        if tool_kind in _CONNECTING_KINDS:
            for key in _TARGET_KEYS & set(config):
                if config[key] not in (None, ""):
                    raise self._refuse(where, f"{key!r} names a connection target inline; a generated playbook "
                                       "connects only where its delegated credential points")  # fmt: skip

    def url(self, url: str, where: str) -> None:
        """A network URL a restricted execution requests (a tool's target, each redirect hop of
        ``kind: http``): its host must be in the grant's ``allow_hosts`` (none listed: no host), and a
        listed *name* must not resolve to the worker's loopback or link-local addresses (the egress
        proxy's rule, tools/egress.py: only an entry that writes the address itself reaches one)."""
        why = host_refusal(url, self.grant.hosts or frozenset())
        if why is None:
            parts = urlsplit(url.strip())
            default = 443 if parts.scheme.lower() in ("https", "wss") else 80
            try:
                why = resolve_checked(parts.hostname or "", parts.port or default)[1]
            except (
                OSError,
                UnicodeError,
                ValueError,
            ):  # does not resolve: the tool's connection error says so
                why = None
        if why:
            raise self._refuse(where, why)

    def _ducklake(self, config: Mapping[str, Any], where: str) -> None:
        """A generated playbook's lake stays its own: a catalog file and data files in its directory (the
        walk checks local paths), a Postgres catalog or S3 data only through a delegated credential: no
        inline connection string, no inline S3 keys, never the worker's AWS environment."""
        cat = config.get("catalog_connection")
        if isinstance(cat, str) and cat.strip():
            text = cat.strip().removeprefix("ducklake:")
            if text.lower().startswith(("postgres:", "postgresql:")) or "=" in text:
                raise self._refuse(where, "'catalog_connection' names a Postgres catalog inline; a generated "
                                   "playbook reaches one only through a delegated credential (`auth: <name>`)")  # fmt: skip
            self.path(text, where)
        s3 = config.get("s3")
        if isinstance(s3, Mapping) and set(s3) - {"credential"}:
            raise self._refuse(
                where, "inline S3 settings count as a credential; give `s3: {credential: <name>}`"
            )
        data = config.get("data_path")
        remote = data.strip().lower() if isinstance(data, str) and "://" in data else ""
        if remote and not remote.startswith("file://"):
            if not remote.startswith("s3://"):
                raise self._refuse(where, f"'data_path' {data.strip()!r}: a generated playbook keeps its data files "
                                   "in its own directory, or on S3 through a delegated credential")  # fmt: skip
            if not (isinstance(s3, Mapping) and s3.get("credential")):
                raise self._refuse(where, "S3 data files need `s3: {credential: <delegated name>}`; a generated "
                                   "playbook never uses the worker's AWS environment")  # fmt: skip

    def _walk(self, kind: str, value: Any, where: str, names: list[str], top: bool = False) -> None:
        if isinstance(value, str):
            self._string(value, where)
            return
        if isinstance(value, (list, tuple)):
            for v in value:
                self._walk(kind, v, where, names)
            return
        if not isinstance(value, Mapping):
            return
        for key, v in value.items():
            k = str(key).lower()
            if k in _DATA_KEYS:
                for text in _strings(v):  # data may name resources: only the tenant rule applies
                    self._tenant(text, where)
                continue
            if v in (None, "", [], {}):
                continue
            if k in _CREDENTIAL_KEYS:
                self._credential(
                    v, f"{where} {key}", names, _AUTH_ROLES.get(kind, frozenset()) if top else frozenset()
                )
            elif k in _INLINE_SECRET_KEYS:
                raise self._refuse(where, f"{key!r} is an inline credential (connection string, password or "
                                   "key); a generated playbook uses delegated credentials only")  # fmt: skip
            elif k in _SCOPE_KEYS:
                raise self._refuse(
                    where, f"{key!r} points at another registry or store than this execution's own"
                )
            else:
                self._walk(kind, v, where, names)

    def _credential(
        self, value: Any, where: str, names: list[str], roles: frozenset[str] = frozenset()
    ) -> None:
        if isinstance(value, str):
            if "://" in value or "=" in value or not value.strip() or any(c.isspace() for c in value.strip()):
                raise self._refuse(where, "an inline connection string counts as a credential and none is "
                                   "delegated under it; name a delegated credential")  # fmt: skip
            names.append(value)
        elif isinstance(value, (list, tuple)):
            for v in value:
                self._credential(v, where, names)
        elif isinstance(value, Mapping) and value and {str(k) for k in value} <= roles:
            for v in value.values():  # one credential a role: each must be a delegated name
                self._credential(v, where, names)
        elif isinstance(value, Mapping):
            ref = value.get("credential") or value.get("name") or value.get("key")
            extra = {str(k) for k in value} - {"credential", "name", "key"}
            if not isinstance(ref, str) or extra:
                raise self._refuse(where, "inline auth (a record of connection fields) counts as a credential; "
                                   "name a delegated credential instead")  # fmt: skip
            self._credential(ref, where, names)
        else:
            raise self._refuse(where, f"auth must name a delegated credential, got {type(value).__name__}")

    def _string(self, text: str, where: str) -> None:
        self._tenant(text, where)
        if _USERINFO.match(text.strip()):
            raise self._refuse(where, "a URL with user info is an inline credential")
        if text.strip().lower().startswith(_URL_SCHEMES):  # any tool's network target (mcp, qdrant, ...)
            self.url(text, where)
        self.path(text, where)

    def _tenant(self, text: str, where: str) -> None:
        for other in tenants_named(text):
            if other != self.tenant:
                raise self._refuse(where, f"resource noetl://{other}/… belongs to tenant {other!r}, not "
                                   f"this execution's tenant {self.tenant!r}")  # fmt: skip

    def path(self, text: str, where: str) -> None:
        """A local path (absolute, ``~``, ``file://`` or relative with ``..``) must stay in ``scope_dir``.
        A string with another scheme is checked as the relative path it is to a tool that does not know
        the scheme (DuckDB opens ``x://../../a.duckdb`` as a file): ``..`` may not climb out through it."""
        raw = text.strip()
        local = _LOCAL_URI.match(raw)
        if local:  # the path a tool opens: `file:/x`, `FILE:///x`, `artifact://localfs/x`, %-escapes decoded
            raw = raw[local.end() :]
            raw = "/" + raw.lstrip("/") if local.group(0).lower().endswith("localfs") else raw
            forms = {raw, unquote(raw)}
        elif "\n" in raw:
            return
        else:
            forms = {raw}
        for form in forms:
            if not (form.startswith(("/", "~")) or ".." in form.replace("\\", "/").split("/")):
                continue
            full = os.path.realpath(os.path.join(self.scope_dir, os.path.expanduser(form)))
            if full != self.scope_dir and not full.startswith(self.scope_dir + os.sep):
                raise self._refuse(where, f"path {text.strip()!r} is outside this execution's directory")


def cursor_config(kind: str, auth: Any, options: Mapping[str, Any]) -> dict[str, Any]:
    """A cursor request as the gate reads it: duckdb's ``auth`` is its database file, not a credential."""
    if kind == "duckdb":
        return {"database": auth, **options}
    return {"auth": auth, **options}
