"""The PayloadStore compliance suite (seed 004 Appendix F.3): every adapter — file, S3 (moto's
server), GCS (gcp-storage-emulator) and Azure Blob (Azurite) — passes the same tests, each emulator
a real process on 127.0.0.1 started here: put/get/head/delete/list, metadata sidecars, checksum
validation, atomic writes, region/locality metadata, replay resolution through the registry, and
failure injection (the emulator killed mid-write; a stored object corrupted → a checksum error,
never wrong bytes)."""

from __future__ import annotations

import os
import uuid

import pytest

from noetl_dagster.engine.usage import Meter
from noetl_dagster.storage.offload import Offloader
from noetl_dagster.storage.payload import (
    SIDECAR_SUFFIX,
    ChecksumMismatch,
    FilePayloadStore,
    PayloadNotFound,
    ResultRef,
    checksum_of,
    open_payload_store,
    store_for_uri,
)
from noetl_dagster.storage.resolve import RefResolver, canonical
from tests.storage.emulators import Emulator
from tests.storage.test_objstore_usage import Relay

ADAPTERS = ["file", "s3", "gcs", "azure"]
CLOUDS = ["s3", "gcs", "azure"]


def _open(kind: str, emu: Emulator | None, tmp_path, prefix: str, **extra):
    if kind == "file":
        return open_payload_store(f"file://{tmp_path / 'payloads'}", **extra)
    return open_payload_store(emu.store_url(prefix), **{**emu.store_options(), **extra})


@pytest.fixture(params=ADAPTERS)
def adapter(request, emulators, tmp_path):
    """(kind, store, emulator): a store under a fresh prefix of the adapter's emulator."""
    kind = request.param
    emu = None if kind == "file" else emulators(kind)
    return kind, _open(kind, emu, tmp_path, f"t-{uuid.uuid4().hex[:10]}"), emu


def _raw_overwrite(store, uri: str, data: bytes) -> None:
    """Change stored bytes behind the store's back (the provider's own API, not the store's)."""
    if isinstance(store, FilePayloadStore):
        store._uri_path(uri).write_bytes(data)
    else:
        store.fs.pipe_file(store._path_of(uri), data)
        store.fs.invalidate_cache()


def test_put_get_head_list_delete(adapter):
    kind, store, _ = adapter
    uri = store.put_bytes("acme/lab/e1/result.json", b'{"a":1}')
    assert uri.startswith(store.scheme_names()[0] + "://" if kind != "file" else "file://")
    assert store.owns(uri) and store.exists(uri) and store.size(uri) == 7
    assert store.get_bytes(uri) == b'{"a":1}'
    with store.open_read(uri) as fh:
        assert fh.read() == b'{"a":1}'
    other = store.put_bytes("acme/lab/e2/x.json", b"2")
    store.put_bytes("acme/other/e3/y.json", b"3")
    assert store.list("acme/lab/") == sorted([uri, other])
    assert store.list("acme/none/") == []
    assert store.head(uri)["stored_size"] == 7 and store.head(uri)["sidecar"] is False
    store.delete(uri)
    assert not store.exists(uri)
    with pytest.raises(PayloadNotFound):
        store.get_bytes(uri)
    with pytest.raises(PayloadNotFound):
        store.head(uri)
    store.delete(uri)  # idempotent
    assert store.list("acme/lab/") == [other]


def test_metadata_sidecar_carries_the_typed_reference(adapter):
    kind, store, _ = adapter
    data = os.urandom(10_000)
    ref = store.put("acme/lab/e1/blob.bin", data, content_type="application/x-test", execution_id="e1",
                    schema_ref="noetl://acme/lab/schemas/blob@v1")  # fmt: skip
    assert ref.checksum == checksum_of(data) and ref.size == len(data) and ref.store == store.name
    assert (ref.content_type, ref.execution_id, ref.schema_ref) == ("application/x-test", "e1",
                                                                    "noetl://acme/lab/schemas/blob@v1")  # fmt: skip
    head = store.head(ref.uri)
    assert head["sidecar"] is True and head["stored_size"] == len(data)
    assert {k: head[k] for k in ("uri", "checksum", "content_type", "size", "execution_id")} == {
        "uri": ref.uri, "checksum": ref.checksum, "content_type": "application/x-test", "size": len(data),
        "execution_id": "e1"}  # fmt: skip
    assert store.get(ref.uri) == data == store.get(ref)  # a bare URI verifies by its sidecar
    assert store.list("acme/lab/") == [ref.uri]  # sidecars are not payloads
    assert store.exists(ref.uri + SIDECAR_SUFFIX)
    store.remove(ref.uri)
    assert not store.exists(ref.uri) and not store.exists(ref.uri + SIDECAR_SUFFIX)


def test_checksum_validation_never_returns_wrong_bytes(adapter):
    kind, store, _ = adapter
    data = b'{"rows": [1, 2, 3]}'
    ref = store.put("acme/lab/e1/r.json", data, fmt="json", content_type="application/json")
    for bad in (b'{"rows": [1, 2, 4]}', data[:-3], b""):  # same size, shorter, empty
        _raw_overwrite(store, ref.uri, bad)
        with pytest.raises(ChecksumMismatch):
            store.get(ref)
        with pytest.raises(ChecksumMismatch):
            store.get(ref.uri)
        with pytest.raises(ChecksumMismatch):
            store.read_verified(ref.uri, ref.checksum)
    # no sidecar, no checksum: a bare URI is refused, not read unverified
    plain = store.put_bytes("acme/lab/e1/plain.bin", b"xyz")
    with pytest.raises(ChecksumMismatch, match="unverified"):
        store.get(plain)
    with pytest.raises(ChecksumMismatch, match="unsupported checksum"):
        store.read_verified(plain, "md5:0000")


def test_atomic_writes_show_no_partial_object(adapter):
    kind, store, _ = adapter
    w = store.writer("acme/lab/e1/big.bin")
    chunks = [os.urandom(3 << 20), os.urandom(3 << 20), b"tail"]  # past S3's and GCS's 5 MiB part size
    for c in chunks:
        w.write(c)
        assert not store.exists(w.uri)  # invisible while parts are uploaded
    assert store.list("acme/lab/") == []
    uri = w.commit()
    data = b"".join(chunks)
    assert w.checksum == checksum_of(data) and store.size(uri) == len(data)
    assert store.read_verified(uri, w.checksum) == data
    with pytest.raises(RuntimeError), store.writer("acme/lab/e1/aborted.bin") as w2:
        w2.write(os.urandom(6 << 20))
        raise RuntimeError("producer failed")
    assert not store.exists(w2.uri) and store.list("acme/lab/") == [uri]
    # an overwrite replaces the object whole
    store.put_bytes("acme/lab/e1/big.bin", b"small")
    assert store.get_bytes(uri) == b"small"


def test_region_locality_and_storage_class_metadata(adapter, tmp_path):
    kind, store, emu = adapter
    regional = _open(kind, emu, tmp_path, f"r-{uuid.uuid4().hex[:8]}", region="eu-west-1")
    assert regional.region == "eu-west-1"
    d = regional.describe()
    assert d["store"] == regional.name and d["region"] == "eu-west-1"
    assert d["locality"] == ("local" if kind == "file" else "in-cluster")  # 127.0.0.1 is inside the cluster
    ref = regional.put("k/v.bin", b"v")
    assert (ref.region, ref.locality) == ("eu-west-1", d["locality"])
    assert regional.head(ref.uri)["region"] == "eu-west-1"
    big = Offloader(regional, inline_limit=100).maybe_offload({"x": "y" * 500}, "step/result")
    assert big["$ref"]["region"] == "eu-west-1" and big["$ref"]["content_type"] == "application/json"
    # a reference written before typed references keeps reading
    old = {"uri": ref.uri, "store": ref.store, "format": "bytes", "size": 1, "checksum": ref.checksum}
    assert regional.get_verified(ResultRef.from_dict(old)) == b"v"


def test_replay_resolves_references_through_the_registry(adapter, monkeypatch):
    kind, store, emu = adapter
    value = {"rows": [{"id": i, "name": f"n{i}"} for i in range(3000)]}
    env = Offloader(store, inline_limit=1024).maybe_offload(value, "e1/step/result")
    ref = env["$ref"]
    # a fresh reader knows only the URI and the cloud's standard emulator variables
    for k, v in ({} if emu is None else emu.env()).items():
        monkeypatch.setenv(k, v)
    reader = store_for_uri(ref["uri"])
    assert type(reader) is type(store) and reader.owns(ref["uri"])
    first = RefResolver().summarize_all([env, env])  # duplicates are summed up once
    assert len(first) == 1
    s = first[0]
    assert s["status"] == "ok" and s["checksum"] == ref["checksum"] and s["size"] == ref["size"]
    assert s["json_shape"] == {"type": "object", "keys": 1, "fields": {"rows": {"type": "array", "length": 3000,
                               "items": {"type": "object", "keys": 2}}}}  # fmt: skip
    assert "body" not in s  # summaries by default
    assert canonical(RefResolver().summarize_all([env])) == canonical(first)  # deterministic
    full = RefResolver(bodies=True)
    assert full.resolve_value({"r": env}) == {"r": value}
    small = RefResolver(bodies=True, body_limit=1000).summarize(env)
    assert small["status"] == "too_large" and "body" not in small
    _raw_overwrite(store, ref["uri"], b"{}")
    assert RefResolver().summarize(env)["status"] == "checksum_mismatch"
    assert RefResolver(bodies=True).resolve_value(env) == {"$ref": ref, "status": "checksum_mismatch"}
    store.delete(ref["uri"])
    assert RefResolver().summarize(env)["status"] == "missing"


def test_unknown_schemes_fail_with_one_line():
    with pytest.raises(ValueError, match=r"unsupported payload store URL scheme 'ftp://'.*gs://"):
        open_payload_store("ftp://host/x")
    ftp = ResultRef(uri="ftp://h/x", store="?", format="json", size=1, checksum="sha256:00")
    # unsigned: refused before any adapter is asked (storage/locator.py); signed: no adapter, one line
    assert RefResolver().summarize(ftp.to_dict())["status"] == "refused"
    signed = RefResolver().locator.sign(ftp, "default", "default")
    assert RefResolver().summarize(signed.to_dict())["status"] == "no_adapter"
    with pytest.raises(ValueError, match="unknown gs store parameters"):
        open_payload_store("gs://b/p?bogus=1")
    with pytest.raises(ValueError, match="unknown azure store parameters"):
        open_payload_store("azure://c01/p?bogus=1")


@pytest.mark.parametrize("kind", CLOUDS)
def test_network_bytes_go_into_the_usage(kind, emulators, tmp_path):
    """Each cloud adapter counts its requests' bytes (behind a TCP relay: exactly what crossed the wire)."""
    emu = emulators(kind)
    relay = Relay(("127.0.0.1", emu.port))
    try:
        relayed = Emulator.__new__(Emulator)
        relayed.__dict__.update(emu.__dict__, port=relay.port)
        store = _open(kind, relayed, tmp_path, f"u-{uuid.uuid4().hex[:8]}")
        store.put_bytes("warm.bin", b"w")  # container / bucket checks out of the way
        value = {"blob": "x" * 200_000}
        relay.reset()
        meter = Meter()
        ref = store.put_json("big.json", value)
        put = meter.stop()
        assert 200_000 < put["net_out_bytes"] < 200_000 + 8_000, put
        up, down = relay.wire
        assert put["net_out_bytes"] <= up and up - put["net_out_bytes"] < 1_000, (put, relay.wire)
        relay.reset()
        meter = Meter()
        assert store.get_json(ref) == value
        got = meter.stop()
        assert 200_000 < got["net_in_bytes"] < 200_000 + 8_000 and got["bytes_read"] == ref.size, got
        assert (got["net_out_bytes"], got["net_in_bytes"]) == relay.wire, (got, relay.wire)
    finally:
        relay.close()


# --- failure injection -------------------------------------------------------------------------


@pytest.mark.parametrize("kind", CLOUDS)
def test_killing_the_emulator_mid_write_leaves_no_partial_object(kind, tmp_path):
    emu = Emulator(kind, tmp_path / "emu").start()
    try:
        store = open_payload_store(emu.store_url("kill"), **emu.store_options(fail_fast=True))
        kept = store.put("before/kept.bin", b"k" * 1000)
        emu.stop()  # a clean stop: what was committed is on disk before the crash below
        emu.start()
        w = store.writer("during/big.bin")
        w.write(os.urandom(6 << 20))  # parts / blocks already on the server
        emu.kill()
        with pytest.raises(Exception):  # noqa: B017 - whatever the client raises, the commit fails
            w.write(os.urandom(1 << 20))
            w.commit()
        w.closed = True
        emu.start()
        store.fs.invalidate_cache()
        assert not store.exists(w.uri)
        assert w.uri not in store.list()
        if emu.persistent:  # moto keeps nothing across a restart; the others keep what was committed
            assert store.get(kept.uri) == b"k" * 1000
            assert store.list("before/") == [kept.uri]
        # and the store works again after the outage
        again = store.put("after/ok.bin", b"ok")
        assert store.get(again) == b"ok"
    finally:
        emu.stop()


@pytest.mark.parametrize("kind", ADAPTERS)
def test_a_corrupted_object_is_a_checksum_error_through_every_read_path(
    kind, emulators, tmp_path, monkeypatch
):
    emu = None if kind == "file" else emulators(kind)
    store = _open(kind, emu, tmp_path, f"c-{uuid.uuid4().hex[:8]}")
    value = {"k": "v" * 100_000}
    env = Offloader(store, inline_limit=1024).maybe_offload(value, "e/step/result")
    ref = ResultRef.from_dict(env["$ref"])
    data = store.get_bytes(ref.uri)
    flipped = bytearray(data)
    flipped[len(data) // 2] ^= 0x01  # one bit
    _raw_overwrite(store, ref.uri, bytes(flipped))
    with pytest.raises(ChecksumMismatch):
        store.get_json(ref)
    with pytest.raises(ChecksumMismatch):
        Offloader(store).resolve(env)
    if emu is not None:
        for k, v in emu.env().items():
            monkeypatch.setenv(k, v)
    assert RefResolver(bodies=True).summarize(env)["status"] == "checksum_mismatch"


@pytest.mark.parametrize("kind", CLOUDS)
def test_credentials_come_from_the_keychain(kind, emulators, monkeypatch):
    """``credential=NAME`` in the URL reads a stored record (here ``NOETL_CREDENTIAL_<NAME>``)."""
    import json

    emu = emulators(kind)
    record = {"s3": {"aws_access_key_id": "testing", "aws_secret_access_key": "testing", "endpoint_url": emu.endpoint},
              "gcs": {"token": "anon"},
              "azure": {"connection_string": emu.connection_string}}[kind]  # fmt: skip
    monkeypatch.setenv("NOETL_CREDENTIAL_PAYLOADS", json.dumps(record))
    for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AZURE_STORAGE_CONNECTION_STRING"):
        monkeypatch.delenv(k, raising=False)
    extra = {"s3": "", "gcs": "&endpoint_url=" + emu.endpoint, "azure": "&create_container=true"}[kind]
    store = open_payload_store(f"{emu.store_url('cred')}?credential=payloads{extra}")
    ref = store.put("k.bin", b"secret-less")
    assert store.get(ref.uri) == b"secret-less"
    with pytest.raises(ValueError, match="credential 'nobody' not found"):
        open_payload_store(f"{emu.store_url('cred')}?credential=nobody")


def test_s3_compatible_endpoint_options(emulators):
    """An in-house S3-compatible store: endpoint URL, path-style addressing, storage class."""
    import boto3

    emu = emulators("s3")
    store = open_payload_store(f"s3://{emu.bucket}/compat?endpoint_url={emu.endpoint}&path_style=true"
                               "&storage_class=STANDARD_IA&region=us-east-1", key="testing", secret="testing")  # fmt: skip
    ref = store.put("k.bin", b"ia")
    assert ref.storage_class == "STANDARD_IA" and ref.region == "us-east-1"
    client = boto3.client("s3", endpoint_url=emu.endpoint, aws_access_key_id="testing",
                          aws_secret_access_key="testing", region_name="us-east-1")  # fmt: skip
    head = client.head_object(Bucket=emu.bucket, Key="compat/k.bin")
    assert head["StorageClass"] == "STANDARD_IA"
    assert store.fs.client_kwargs.get("region_name") == "us-east-1"
    assert store.fs.config_kwargs["s3"] == {"addressing_style": "path"}


def test_noetl_references_resolve_through_the_resource_catalog(tmp_path):
    """A ``noetl://`` reference (a registered table version) resolves through the registry's read
    plan to its location and expected checksum, then through the payload registry."""
    from noetl_dagster.storage.tables import TableStorage
    from noetl_registry.client import open_registry
    from noetl_registry.service import Registry

    client = open_registry(Registry(f"sqlite:///{tmp_path / 'registry.db'}"), tenant="acme", project="lab")
    storage = TableStorage(client, data_dir=tmp_path / "home")
    pub = storage.publish({"id": [1, 2, 3], "v": ["a", "b", "c"]}, "noetl://acme/lab/sales/dataset/orders",
                          format="parquet")  # fmt: skip
    ref = {"uri": pub.resource.uri, "store": "noetl", "format": "parquet", "size": pub.write.size,
           "checksum": pub.write.checksum}  # fmt: skip
    s = RefResolver(registry=client).summarize(ref)
    assert s["status"] == "ok" and s["location"] == pub.write.uri and s["arrow_schema"]["rows"] == 3
    assert RefResolver().summarize(ref)["status"] == "no_adapter"  # without a catalog: said, not guessed
    missing = RefResolver(registry=client).summarize({**ref, "uri": "noetl://acme/lab/sales/dataset/none@v1"})
    assert missing["status"] == "missing"
    _raw_overwrite(storage.store, pub.write.uri, b"PAR1 not parquet")
    assert RefResolver(registry=client).summarize(ref)["status"] == "checksum_mismatch"


@pytest.mark.parametrize("kind", CLOUDS)
def test_tables_publish_and_fetch_on_every_cloud(kind, emulators, tmp_path):
    """The tables layer (IO managers, kind: parquet/arrow) on a cloud store; a reader configured
    with another prefix reaches the file through the registry (same connection, see sibling())."""
    import pyarrow as pa

    from noetl_dagster.storage.tables import TableStorage
    from noetl_registry.client import open_registry
    from noetl_registry.service import Registry

    emu = emulators(kind)
    client = open_registry(Registry(f"sqlite:///{tmp_path / 'registry.db'}"), tenant="acme", project="lab")
    writer = TableStorage(
        client, _open(kind, emu, tmp_path, f"tables-{uuid.uuid4().hex[:8]}"), data_dir=tmp_path
    )
    table = pa.table({"id": list(range(1000)), "v": [f"r{i}" for i in range(1000)]})
    for fmt in ("parquet", "arrow"):
        pub = writer.publish(table, f"noetl://acme/lab/sales/dataset/orders_{fmt}", format=fmt)
        assert pub.write.uri.startswith(writer.store.scheme_names()[0] + "://")
        reader = TableStorage(client, _open(kind, emu, tmp_path, "elsewhere"), data_dir=tmp_path)
        assert not reader.store.owns(pub.write.uri)
        got, plan = reader.fetch(f"noetl://acme/lab/sales/dataset/orders_{fmt}")
        assert got.equals(table) and plan.expected_checksum == pub.write.checksum


def test_without_the_cloud_extras_the_error_names_the_extra(tmp_path):
    """On a core install (tests/packaging/no_extras.py blocks every optional package) a gs:// or
    azure:// URL is a one-line hint, not an ImportError."""
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[1] / "packaging" / "no_extras.py"
    snippet = ("from noetl_dagster.storage.payload import open_payload_store\n"
               "for u in ('gs://b/p', 'azure://cont/p'):\n"
               "    try:\n        open_payload_store(u)\n    except ValueError as e:\n        print(e)\n")  # fmt: skip
    out = subprocess.run([sys.executable, str(script), "code", snippet], capture_output=True, text=True,
                         timeout=120, cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(script.parents[2])})  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [
        "gs:// payload stores need gcsfs: pip install 'noetl-dagster[gcs]'",
        "azure:// payload stores need adlfs: pip install 'noetl-dagster[azure]'",
    ]
