"""Issue 29, item 6: the audit log is no existence oracle, and one rule refuses a segment with a
trailing dot in the service and both clients. The real service: SQLite and Postgres, in-process
and over HTTP (uvicorn on loopback)."""

from __future__ import annotations

import pytest

from noetl_dagster.dsl.locator import InvalidLocator, parse_locator
from noetl_registry.errors import Forbidden, InvalidRequest

_ENVELOPE = ("seq", "ts", "uri")  # what differs between any two entries


def _view(entry) -> dict:
    return {k: v for k, v in entry.model_dump().items() if k not in _ENVELOPE}


def test_a_denied_caller_learns_nothing_of_what_exists_from_the_audit_log(connect, tenants):
    """B was denied A's data; B's audit entries showed the URI and latest version of what it probed
    (`resolve …/in` → `…/in@v2`), the URI behind an id, and the hidden lineage neighbour."""
    ta, tb = tenants
    a, b = connect(ta, "lab"), connect(tb, "x")
    series = f"noetl://{ta}/lab/raw/dataset/in"
    a.register(series, locations=[{"uri": "s3://a/in1"}])
    raw = a.register(series, locations=[{"uri": "s3://a/in2"}])  # @v2: the latest version
    out = a.register(
        f"noetl://{ta}/lab/gold/dataset/out", inputs=[raw.uri], locations=[{"uri": "s3://a/out"}]
    )
    a.grant(out.uri, f"tenant:{tb}")  # B may read `out`, not its input
    ghost = f"noetl://{ta}/lab/raw/dataset/ghost"  # never registered
    start = b.audit(limit=1000).next_after

    for uri in (series, ghost, f"{series}@latest", f"{ghost}@latest"):
        with pytest.raises(Forbidden):
            b.resolve(uri)
    with pytest.raises(Forbidden):
        b.get(raw.resource_id)
    with pytest.raises(Forbidden):
        b.add_location(raw.resource_id, {"uri": "s3://evil/x"})
    assert b.lineage(out.resource_id).hidden == 1
    bodies = []  # the 403 bodies for an input that exists and one that does not: the same words
    for uri in (raw.uri, f"{ghost}@v2"):
        with pytest.raises(Forbidden) as e:
            b.register(f"noetl://{tb}/x/ns/dataset/stolen", inputs=[uri])
        bodies.append(e.value.message.replace(uri, "URI"))
    assert bodies[0] == bodies[1]

    mine = [e for e in b.audit(after=start, limit=1000).entries if e.actor_tenant == tb and not e.allowed]
    assert len(mine) == 9  # 4 resolves, get, add_location, the hidden neighbour, 2 registers
    asked = {series, ghost, f"{series}@latest", f"{ghost}@latest", raw.uri, f"{ghost}@v2"}
    assert {e.uri for e in mine} <= asked | {None}  # an entry names only what B asked for
    text = " ".join(str(_view(e)) for e in mine)
    for secret in ("@v1", "@v2", "noetl://", "s3://a"):  # versions found, URIs behind ids, locations
        assert secret not in text, (secret, text)
    assert raw.resource_id in text  # (a call by id names the id it asked for)
    assert all(e.owner_tenant is None and e.owner_project is None for e in mine)
    resolves = {e.uri: _view(e) for e in mine if e.action == "resolve:read"}
    assert set(resolves) == {series, ghost, f"{series}@latest", f"{ghost}@latest"}  # what B asked for
    assert resolves[series] == resolves[ghost] and resolves[f"{series}@latest"] == resolves[f"{ghost}@latest"]
    registers = [e for e in mine if e.action == "register"]
    assert [e.uri for e in registers] == [raw.uri, f"{ghost}@v2"] and _view(registers[0]) == _view(
        registers[1]
    )
    assert not [e for e in mine if e.action == "lineage:neighbour" and e.uri]  # the hidden one stays hidden
    by_id = [e for e in mine if e.action in ("get", "add_location")]
    assert by_id and all(e.uri is None and e.reason == f"denied: {raw.resource_id}" for e in by_id)

    # the owner still sees every decision about its data in full
    theirs = [e for e in a.audit(limit=1000).entries if e.actor_tenant == tb and not e.allowed]
    assert {(e.action, e.uri) for e in theirs} >= {
        ("resolve:read", raw.uri),
        ("get", raw.uri),
        ("lineage:neighbour", raw.uri),
        ("register", raw.uri),
    }
    assert all(e.owner_tenant == ta and e.reason for e in theirs)


@pytest.mark.parametrize(
    "tail",
    [
        "ns./dataset/x",
        "ns/dataset./x",
        "ns/dataset/x.",
        "ns/dataset/a./b",
        "ns/dataset/x@v1.",
        "ns/dataset/x.@v1",
    ],
)
def test_a_segment_with_a_trailing_dot_is_refused_by_service_and_clients(connect, tenants, tail):
    """`…/x.` was accepted (and `x.` and `x` name one object on stores that drop the dot)."""
    ta, _ = tenants
    a = connect(ta, "lab")
    uri = f"noetl://{ta}/lab/{tail}"
    with pytest.raises(InvalidLocator, match="not ending with '.'"):
        parse_locator(uri, require_version=False)
    for call in (lambda: a.register(uri), lambda: a.resolve(uri), lambda: a.grant(uri, f"tenant:{ta}")):
        with pytest.raises(InvalidRequest, match="not ending with '.'"):
            call()
    assert parse_locator(f"noetl://{ta}/lab/ns.1/data_set-/x.y@v1.2").name == "x.y"  # inner dots still fine
