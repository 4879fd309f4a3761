"""Schemathesis sweep of the OpenAPI schema with generated values, valid and hostile
(negative mode: wrong types, out-of-range numbers, oversized strings), against the
FastAPI app in-process on SQLite and on Postgres: no response may be a 5xx, and every
error is JSON. Bounded: EXAMPLES per operation and mode, well under a minute."""

from __future__ import annotations

import time

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode

from noetl_registry.app import create_app

EXAMPLES = 40


@pytest.mark.slow
def test_openapi_sweep_finds_no_server_error(registry, tenants):
    ta, _ = tenants
    _, key = registry.create_api_key(ta, "lab")
    app = create_app(registry)
    # something to find: a resource of the caller's and one of its grants
    from noetl_registry.client import open_registry

    own = open_registry(registry, key)
    res = own.register(f"noetl://{ta}/lab/ns/dataset/fuzz", locations=[{"uri": "s3://f/1"}])
    own.grant(res.uri, "tenant:someone")

    schema = schemathesis.openapi.from_asgi("/openapi.json", app)
    auth = {"Authorization": f"Bearer {key}"}
    failures: list[str] = []
    counts = {"requests": 0, "4xx": 0, "2xx": 0}
    t0 = time.monotonic()
    for result in schema.get_all_operations():
        op = result.ok()
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            try:
                strategy = op.as_strategy(generation_mode=mode)
            except Exception as e:  # noqa: BLE001 - an operation with nothing to negate
                if mode is GenerationMode.NEGATIVE:
                    continue
                raise AssertionError(f"{op.label}: {e}") from e

            try:
                _sweep(op.label, strategy, auth, failures, counts)
            except Unsatisfiable:
                assert mode is GenerationMode.NEGATIVE, op.label  # nothing to negate (no parameters)
    elapsed = time.monotonic() - t0
    print(
        f"openapi sweep ({registry.store.dialect}): {counts['requests']} requests, {counts['2xx']} 2xx, "
        f"{counts['4xx']} 4xx, "
        f"{len(failures)} 5xx, {elapsed:.1f} s"
    )
    assert not failures, "\n".join(failures[:20])
    assert counts["requests"] > 100
    # elapsed is reported, not asserted: speed is a benchmark figure (a loaded machine took 78 s)


def _sweep(label, strategy, auth, failures, counts) -> None:
    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        database=None,
        derandomize=True,
        suppress_health_check=list(HealthCheck),
    )
    @given(case=strategy)
    def probe(case):
        headers = dict(case.headers or {})
        headers["Authorization"] = auth["Authorization"]  # a real key, so requests reach the handlers
        response = case.call(headers=headers)
        counts["requests"] += 1
        if response.status_code >= 500:
            failures.append(f"{label} -> {response.status_code}: {case.as_curl_command()}")
        elif response.status_code >= 400:
            counts["4xx"] += 1
            body = response.json()
            assert isinstance(body, dict) and "detail" in body, (label, response.text)
        else:
            counts["2xx"] += 1

    probe()


@pytest.fixture(autouse=True)
def _quiet_schemathesis_warnings():
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


# ------------------------------------------------------------------ hostile values over the spec
# Schemathesis draws mostly plausible values; the values that used to turn into 500s are extreme
# ones (10**30 cursors, NUL bytes, lone surrogates, dates past 9999 in UTC, NaN, deep nesting).
# This sweep walks the same OpenAPI document and puts those into every parameter and body field.
HOSTILE_NUMBERS = [10**30, -(10**30), 2**63, 2**63 - 1, -1, 0, 1e308, "1e400", "NaN"]
HOSTILE_TEXT = [
    "\x00",
    "a\x00b",
    "x" * 5000,
    "'; DROP TABLE registry_grant; --",
    "../../etc",
    "%",
    "_",
    "noetl://a/b/c/d/e@v1",
    "urn:noetl:a:b:c:d:e:v1",
    "9999-12-31T23:59:59-23:59",
    "0001-01-01T00:00:00+23:59",
    "0999-01-01T00:00:00Z",
    "2016-12-31T23:59:60Z",
    "",
]
HOSTILE_BODY_ONLY = [
    "\ud800",
    float("nan"),
    float("inf"),
    None,
    [],
    {},
    {"a": "\x00"},
    [[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]],
    {"k" * 10: "v" * 70_000},
    True,
    [{"uri": "s3://x"}] * 100,
]
SPEC_EXAMPLES = 40


@pytest.mark.slow
def test_hostile_values_over_the_spec_find_no_server_error(registry, tenants):

    from fastapi.testclient import TestClient
    from hypothesis import strategies as st

    from noetl_registry.client import open_registry

    ta, _ = tenants
    _, key = registry.create_api_key(ta, "lab")
    own = open_registry(registry, key)
    res = own.register(f"noetl://{ta}/lab/ns/dataset/spec", locations=[{"uri": "s3://s/1"}])
    grant = own.grant(res.uri, "tenant:someone")
    app = create_app(registry)
    spec = app.openapi()
    valid = {
        "uri": res.uri,
        "resource_uri": res.uri,
        "resource_id": res.resource_id,
        "grant_id": grant.grant_id,
        "subject": "tenant:someone",
        "series": res.series,
    }
    valid_bodies = {
        ("post", "/v1/resources"): {"uri": res.series, "locations": [{"uri": "s3://s/new"}]},
        ("post", "/v1/grants"): {
            "resource_uri": res.uri,
            "subject": "tenant:someone",
            "expires_at": "2999-01-01T00:00:00Z",
        },
        ("post", "/v1/resources/{resource_id}/locations"): {"uri": "s3://s/replica", "region": "eu"},
    }
    client = TestClient(app, headers={"Authorization": f"Bearer {key}"}, raise_server_exceptions=False)
    failures: list[str] = []
    sent = {"n": 0}
    t0 = time.monotonic()

    def field(name: str, good, pool):
        return st.one_of(st.just(good), st.sampled_from(pool)) if good is not None else st.sampled_from(pool)

    for path, ops in spec["paths"].items():
        for method, op in ops.items():
            params = op.get("parameters", [])
            body = valid_bodies.get((method, path))
            fields = {}
            for prm in params:
                fields[("param", prm["in"], prm["name"])] = field(
                    prm["name"], valid.get(prm["name"]), HOSTILE_NUMBERS + HOSTILE_TEXT
                )
            for name, good in (body or {}).items():
                fields[("body", "", name)] = field(
                    name, good, HOSTILE_NUMBERS + HOSTILE_TEXT + HOSTILE_BODY_ONLY
                )
            if body is not None:  # and fields the valid body does not have
                ref = op["requestBody"]["content"]["application/json"]["schema"]["$ref"].rsplit("/", 1)[1]
                for name in spec["components"]["schemas"][ref]["properties"]:
                    fields.setdefault(
                        ("body", "", name),
                        st.one_of(
                            st.just(_ABSENT),
                            st.sampled_from(HOSTILE_NUMBERS + HOSTILE_TEXT + HOSTILE_BODY_ONLY),
                        ),
                    )
            if not fields:
                continue

            _spec_probe(fields, path, method, body is not None, client, failures, sent)()
    elapsed = time.monotonic() - t0
    print(
        f"hostile spec sweep ({registry.store.dialect}): {sent['n']} requests, {len(failures)} 5xx, "
        f"{elapsed:.1f} s"
    )
    assert not failures, "\n".join(failures[:20])
    # elapsed is reported, not asserted: speed is a benchmark figure (a loaded machine took 78 s)


_ABSENT = object()


def _spec_probe(fields, path, method, body_given, client, failures, sent):
    import json
    from urllib.parse import quote

    from hypothesis import strategies as st

    @settings(
        max_examples=SPEC_EXAMPLES,
        deadline=None,
        database=None,
        derandomize=True,
        suppress_health_check=list(HealthCheck),
    )
    @given(values=st.fixed_dictionaries(fields))
    def probe(values):
        url, query, payload = path, {}, {}
        for (kind, where, name), value in values.items():
            if value is _ABSENT:
                continue
            if kind == "body":
                payload[name] = value
            elif where == "path":
                url = url.replace("{" + name + "}", quote(str(value), safe="") or "%20")
            elif not (isinstance(value, str) and "\ud800" in value):
                query[name] = value
        kw = {}
        if body_given:
            kw = {
                "content": json.dumps(payload, allow_nan=True).encode("utf-8", "surrogatepass"),
                "headers": {"content-type": "application/json"},
            }
        r = client.request(method.upper(), url, params=query, **kw)
        sent["n"] += 1
        if r.status_code >= 500:
            failures.append(f"{method.upper()} {url} {query} {str(payload)[:300]} -> {r.status_code}")
        elif r.status_code >= 400:
            assert isinstance(r.json(), dict) and "detail" in r.json(), r.text

    return probe
