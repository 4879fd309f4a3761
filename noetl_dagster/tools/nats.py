"""``kind: nats``: NATS core, JetStream and Key/Value through nats-py.

``operation`` is one of:

| operation | inputs | result |
|---|---|---|
| ``publish`` | ``subject``, ``data`` \\| ``payload``, ``headers`` | ``{subject, bytes}`` |
| ``request`` | ``subject``, ``data``, ``timeout`` (s, default 5) | ``{subject, data, headers}`` (the reply) |
| ``js_publish`` | ``subject``, ``data``, ``headers``, ``stream`` (expected) | ``{stream, seq, duplicate}`` |
| ``js_consume`` | ``stream``, ``subject`` (filter), ``durable``, ``batch`` (10), ``timeout`` (1 s), ``ack`` (true) | ``{messages: [{subject, seq, data, headers}], count}`` |
| ``js_get_msg`` | ``stream``, ``seq`` \\| ``subject`` (last) | ``{subject, seq, data, headers}`` |
| ``js_stream_info`` | ``stream`` | ``{stream, subjects, messages, bytes, first_seq, last_seq}`` |
| ``kv_put`` / ``kv_get`` / ``kv_delete`` / ``kv_keys`` / ``kv_purge`` | ``bucket``, ``key``, ``value`` | NoETL's shapes |

Data: a mapping or list is sent as JSON, a string as UTF-8; received data is parsed as JSON
when it is JSON, else returned as text. ``kv_put`` creates a missing bucket (``create_bucket:
false`` to refuse). ``js_consume`` with a ``durable`` name resumes where the last call stopped
(acked messages are not redelivered); without one it reads the stream from the start.

Connection: ``servers`` | ``url`` | ``nats_url``, or the ``auth`` credential's ``nats_url`` / ``url``
(with ``nats_user``/``user``, ``nats_password``/``password``, ``nats_token``/``token``); default
``$NOETL_NATS_URL`` or ``nats://127.0.0.1:4222``. Errors: ``connection_error`` (retryable),
``timeout`` (retryable), ``no_responders``, ``not_found``, ``nats_error``.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import Field

from noetl_dagster.tools.configs import ToolConfig
from noetl_dagster.tools.registry import ToolContext, ToolError, register_tool

DEFAULT_URL = "nats://127.0.0.1:4222"
Operation = Literal[
    "publish",
    "request",
    "js_publish",
    "js_consume",
    "js_get_msg",
    "js_stream_info",
    "kv_put",
    "kv_get",
    "kv_delete",
    "kv_keys",
    "kv_purge",
]


class NatsConfig(ToolConfig):
    operation: Operation = Field(..., description="what to do (see docs/tools.md)")
    subject: str | None = Field(None, description="subject (publish, request, js_*)")
    data: Any = Field(None, description="message body: mapping/list -> JSON, string -> UTF-8")
    payload: Any = Field(None, description="alias of data")
    headers: dict[str, str] | None = Field(None, description="message headers")
    timeout: float | None = Field(None, gt=0, description="seconds (request 5, js_consume 1)")
    stream: str | None = Field(None, description="JetStream stream")
    durable: str | None = Field(None, description="js_consume: durable consumer name (resumable)")
    batch: int | None = Field(None, ge=1, le=10000, description="js_consume: messages per call (10)")
    ack: bool = Field(True, description="js_consume: ack what was read")
    seq: int | None = Field(None, ge=1, description="js_get_msg: stream sequence")
    bucket: str | None = Field(None, description="KV bucket")
    key: str | None = Field(None, description="KV key")
    value: Any = Field(None, description="KV value")
    create_bucket: bool = Field(True, description="kv_put: create a missing bucket")
    pattern: str | None = Field(None, description="kv_keys: fnmatch filter")
    servers: str | list[str] | None = Field(None, description="NATS server URL(s)")
    url: str | None = Field(None, description="alias of servers")
    nats_url: str | None = Field(None, description="alias of servers")
    auth: str | dict[str, Any] | None = Field(
        None, description="credential with nats_url/user/password/token"
    )


def _encode(value: Any) -> bytes:
    if value is None:
        return b""
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode()
    return json.dumps(value, default=str).encode()


def _decode(data: bytes | None) -> Any:
    if not data:
        return None
    text = data.decode("utf-8", errors="replace")
    try:
        return json.loads(text)
    except ValueError:
        return text


def _connect_args(inputs: Mapping[str, Any], ctx: ToolContext) -> dict[str, Any]:
    record: dict[str, Any] = {}
    auth = inputs.get("auth")
    if isinstance(auth, str) and auth:
        record = dict(ctx.credential(auth))
    elif isinstance(auth, Mapping):
        record = dict(auth)
    servers = (
        inputs.get("servers")
        or inputs.get("url")
        or inputs.get("nats_url")
        or record.get("nats_url")
        or record.get("url")
        or record.get("servers")
        or os.environ.get("NOETL_NATS_URL")
        or DEFAULT_URL
    )
    args: dict[str, Any] = {
        "servers": servers if isinstance(servers, list) else [s.strip() for s in str(servers).split(",")],
        "connect_timeout": 2,
        "max_reconnect_attempts": 0,
        "allow_reconnect": False,
        "reconnect_time_wait": 0.2,
    }
    user, password = (
        record.get("nats_user") or record.get("user"),
        record.get("nats_password") or record.get("password"),
    )
    token = record.get("nats_token") or record.get("token")
    if user and password:
        args.update(user=str(user), password=str(password))
        ctx.redact(str(password))
    elif token:
        args["token"] = str(token)
        ctx.redact(str(token))
    return args


def _need(inputs: Mapping[str, Any], *keys: str) -> None:
    missing = [k for k in keys if not inputs.get(k)]
    if missing:
        raise ToolError(
            f"nats: operation {inputs['operation']} needs {', '.join(missing)}", kind="config_error"
        )


def _msg(m: Any) -> dict[str, Any]:
    meta = getattr(m, "metadata", None)
    seq = getattr(m, "seq", None) or (meta.sequence.stream if meta is not None else None)
    return {"subject": m.subject, "seq": seq, "data": _decode(m.data), "headers": dict(m.headers or {})}


async def _js_consume(js: Any, inputs: Mapping[str, Any]) -> dict[str, Any]:
    import nats.errors  # noqa: PLC0415

    batch, timeout = int(inputs.get("batch") or 10), float(inputs.get("timeout") or 1.0)
    sub = await js.pull_subscribe(
        inputs.get("subject") or "", durable=inputs.get("durable"), stream=inputs["stream"]
    )
    out: list[dict[str, Any]] = []
    try:
        while len(out) < batch:
            try:
                msgs = await sub.fetch(batch - len(out), timeout=timeout)
            except nats.errors.TimeoutError:
                break  # the stream has nothing more right now
            for m in msgs:
                out.append(_msg(m))
                if inputs.get("ack", True):
                    await m.ack_sync()
    finally:
        if not inputs.get("durable"):
            await sub.unsubscribe()
    return {"stream": inputs["stream"], "messages": out, "count": len(out)}


async def _kv(js: Any, op: str, inputs: Mapping[str, Any]) -> dict[str, Any]:
    import nats.js.errors as jserr  # noqa: PLC0415

    bucket, key = inputs["bucket"], inputs.get("key")
    try:
        kv = await js.key_value(bucket)
    except jserr.BucketNotFoundError:
        if op != "kv_put" or not inputs.get("create_bucket", True):
            raise ToolError(f"nats: KV bucket {bucket!r} does not exist", kind="not_found") from None
        kv = await js.create_key_value(bucket=bucket)
    if op == "kv_put":
        revision = await kv.put(key, _encode(inputs.get("value")))
        return {"status": "success", "bucket": bucket, "key": key, "revision": revision}
    if op == "kv_get":
        try:
            entry = await kv.get(key)
        except jserr.KeyNotFoundError:
            return {"status": "not_found", "bucket": bucket, "key": key, "value": None, "found": False}
        return {
            "status": "success",
            "bucket": bucket,
            "key": key,
            "value": _decode(entry.value),
            "revision": entry.revision,
            "found": True,
        }
    if op in ("kv_delete", "kv_purge"):
        await (kv.delete(key) if op == "kv_delete" else kv.purge(key))
        return {"status": "success", "bucket": bucket, "key": key}
    try:
        keys = list(await kv.keys())
    except jserr.NoKeysError:
        keys = []
    if inputs.get("pattern"):
        import fnmatch  # noqa: PLC0415

        keys = [k for k in keys if fnmatch.fnmatch(k, inputs["pattern"])]
    return {"status": "success", "bucket": bucket, "keys": keys, "count": len(keys)}


async def _run(inputs: Mapping[str, Any], args: dict[str, Any]) -> dict[str, Any]:
    import nats  # noqa: PLC0415

    op = inputs["operation"]
    data = inputs.get("data") if inputs.get("data") is not None else inputs.get("payload")
    headers = inputs.get("headers") or None

    async def quiet(e: Exception) -> None:  # errors surface as the ToolError below, not as log noise
        return None

    try:
        # nats-py keeps retrying an initial connect to a dead server; bound it
        nc = await asyncio.wait_for(nats.connect(**args, error_cb=quiet), timeout=args["connect_timeout"] + 1)
    except (TimeoutError, OSError, nats.errors.NoServersError) as e:
        raise ToolError(
            f"nats: cannot connect to {','.join(args['servers'])}: {e or type(e).__name__}",
            kind="connection_error",
            retryable=True,
        ) from None
    try:
        js = nc.jetstream()
        if op == "publish":
            body = _encode(data)
            await nc.publish(inputs["subject"], body, headers=headers)
            await nc.flush()
            return {"subject": inputs["subject"], "bytes": len(body)}
        if op == "request":
            reply = await nc.request(
                inputs["subject"], _encode(data), timeout=float(inputs.get("timeout") or 5), headers=headers
            )
            return {
                "subject": inputs["subject"],
                "data": _decode(reply.data),
                "headers": dict(reply.headers or {}),
            }
        if op == "js_publish":
            ack = await js.publish(
                inputs["subject"], _encode(data), stream=inputs.get("stream"), headers=headers
            )
            return {"stream": ack.stream, "seq": ack.seq, "duplicate": bool(ack.duplicate)}
        if op == "js_consume":
            return await _js_consume(js, inputs)
        if op == "js_get_msg":
            if inputs.get("seq"):
                m = await js.get_msg(inputs["stream"], seq=int(inputs["seq"]))
            else:
                m = await js.get_msg(inputs["stream"], subject=inputs.get("subject"), last=True)
            return _msg(m)
        if op == "js_stream_info":
            info = await js.stream_info(inputs["stream"])
            return {
                "stream": info.config.name,
                "subjects": list(info.config.subjects or []),
                "messages": info.state.messages,
                "bytes": info.state.bytes,
                "first_seq": info.state.first_seq,
                "last_seq": info.state.last_seq,
            }
        return await _kv(js, op, inputs)
    finally:
        await nc.close()


_NEEDS = {
    "publish": ("subject",),
    "request": ("subject",),
    "js_publish": ("subject",),
    "js_consume": ("stream",),
    "js_get_msg": ("stream",),
    "js_stream_info": ("stream",),
    "kv_put": ("bucket", "key"),
    "kv_get": ("bucket", "key"),
    "kv_delete": ("bucket", "key"),
    "kv_purge": ("bucket", "key"),
    "kv_keys": ("bucket",),
}


@register_tool(
    "nats", config=NatsConfig, description="NATS publish, request/reply, JetStream and KV (nats-py)"
)
def nats_tool(inputs: dict[str, Any], ctx: ToolContext) -> Any:
    """NATS publish / request / JetStream publish+consume / KV operations."""
    import nats.errors  # noqa: PLC0415
    import nats.js.errors as jserr  # noqa: PLC0415

    op = inputs.get("operation")
    if op not in _NEEDS:
        raise ToolError(
            f"nats: operation must be one of {', '.join(_NEEDS)}, not {op!r}", kind="config_error"
        )
    _need(inputs, *_NEEDS[op])
    args = _connect_args(inputs, ctx)
    where = ",".join(args["servers"])
    try:
        return asyncio.run(_run(inputs, args))
    except ToolError:
        raise
    except nats.errors.NoRespondersError:
        raise ToolError(f"nats: no responders on {inputs.get('subject')!r}", kind="no_responders") from None
    except (nats.errors.NoServersError, ConnectionRefusedError, OSError) as e:
        raise ToolError(
            f"nats: cannot connect to {where}: {e or type(e).__name__}",
            kind="connection_error",
            retryable=True,
        ) from None
    except (TimeoutError, nats.errors.TimeoutError):
        raise ToolError(f"nats: {op} timed out ({where})", kind="timeout", retryable=True) from None
    except jserr.NotFoundError as e:
        raise ToolError(
            f"nats: {op}: not found: {e.description or e}",
            kind="not_found",
            code=getattr(e, "err_code", None),
        ) from None
    except (nats.errors.Error, jserr.Error) as e:
        raise ToolError(f"nats: {op} failed: {e}", kind="nats_error") from None
