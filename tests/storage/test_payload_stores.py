"""PayloadStore compliance suite (seed 004 Appendix F.3): the filesystem adapter and the
S3-compatible adapter against moto's server mode, with the same tests."""

from __future__ import annotations

import os
from urllib.parse import unquote

import boto3
import pytest

from noetl_dagster.dsl.locator import object_prefix
from noetl_dagster.storage.object_stores import S3PayloadStore
from noetl_dagster.storage.offload import Offloader
from noetl_dagster.storage.payload import (
    ChecksumMismatch,
    FilePayloadStore,
    PayloadNotFound,
    ResultRef,
    is_ref,
    iter_refs,
    open_payload_store,
    payload_key,
    sha256,
)


@pytest.fixture(params=["file", "s3"])
def store(request, tmp_path):
    if request.param == "file":
        return FilePayloadStore(tmp_path / "payloads")
    endpoint, bucket, opts = request.getfixturevalue("s3_bucket")
    return S3PayloadStore(bucket, "root/prefix", **opts)


def _tamper(store, uri: str, data: bytes) -> None:
    """Change stored bytes behind the store's back."""
    if isinstance(store, FilePayloadStore):
        path = store._uri_path(uri)
        path.write_bytes(data)
    else:
        bucket, _, key = uri[len("s3://") :].partition("/")
        boto3.client(
            "s3",
            endpoint_url=store.endpoint_url,
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
            region_name="us-east-1",
        ).put_object(Bucket=bucket, Key=key, Body=data)


def test_put_get_head_list_delete(store):
    key = payload_key("acme", "lab", "exec_1/step/result.json")
    uri = store.put_bytes(key, b'{"a":1}')
    assert uri.startswith(f"{store.name}://")
    assert store.owns(uri)
    assert store.exists(uri) and store.size(uri) == 7
    assert store.get_bytes(uri) == b'{"a":1}'
    other = store.put_bytes(payload_key("acme", "lab", "exec_2/x.json"), b"2")
    assert store.list(object_prefix("acme", "lab")) == sorted([uri, other])
    assert store.list(object_prefix("acme", "other")) == []
    store.delete(uri)
    assert not store.exists(uri)
    with pytest.raises(PayloadNotFound):
        store.get_bytes(uri)
    store.delete(uri)  # idempotent


def test_streaming_writer_hashes_and_commits_atomically(store):
    w = store.writer("stream/big.bin")
    chunks = [os.urandom(3 << 20), b"tail"]  # one chunk large enough for the hashing thread
    for c in chunks:
        w.write(c)
    assert not store.exists(w.uri)  # invisible until committed
    uri = w.commit()
    data = b"".join(chunks)
    assert w.size == len(data) and w.checksum == sha256(data)
    assert store.read_verified(uri, w.checksum) == data


def test_writer_abort_leaves_nothing(store):
    with pytest.raises(RuntimeError), store.writer("stream/aborted.bin") as w:
        w.write(b"partial")
        raise RuntimeError("producer failed")
    assert not store.exists(w.uri)
    assert store.list("stream") == []


def test_reads_fail_closed_on_checksum_mismatch(store):
    ref = store.put_json("r/value.json", {"rows": list(range(100))})
    assert store.get_json(ref) == {"rows": list(range(100))}
    _tamper(store, ref.uri, b'{"rows":[]}')
    with pytest.raises(ChecksumMismatch, match="checksum mismatch"):
        store.get_json(ref)


@pytest.mark.parametrize("key", ["../escape", "a/../../b", "/abs/path", "a//b", "./a", "a\\b", ""])
def test_keys_cannot_escape_the_store(store, key):
    with pytest.raises(ValueError):
        store.put_bytes(key, b"x")


def test_foreign_uris_are_refused(store, tmp_path):
    foreign = "file:///etc/passwd" if store.name == "file" else "s3://another-bucket/x"
    assert not store.owns(foreign)
    with pytest.raises(ValueError):
        store.get_bytes(foreign)


def test_offloader_keeps_small_values_and_references_big_ones_under_the_shard_prefix(store):
    off = Offloader(store, inline_limit=1024, tenant="acme", project="lab")
    assert off.maybe_offload({"ok": 1}, "e/s") == {"ok": 1}
    big = [{"i": i, "pad": "x" * 20} for i in range(200)]
    env = off.maybe_offload(big, "exec_1/step/result")
    assert is_ref(env)
    ref = ResultRef.from_dict(env["$ref"])
    assert ref.rows == 200 and ref.format == "json" and ref.checksum.startswith("sha256:")
    assert "/shard=s0108/tenant=acme/project=lab/exec_1/step/result.json" in unquote(ref.uri)
    assert off.resolve(env) == big
    assert list(iter_refs({"a": [env, 1], "b": {"c": env}})) == [ref, ref]


def test_offloader_without_scope_keeps_the_old_keys(tmp_path):
    store = FilePayloadStore(tmp_path)
    env = Offloader(store, inline_limit=10).maybe_offload(["x" * 50], "exec/step")
    assert env["$ref"]["uri"] == (tmp_path / "exec/step.json").resolve().as_uri()


def test_open_payload_store_by_url(tmp_path, s3_bucket, monkeypatch):
    assert isinstance(open_payload_store(str(tmp_path / "a")), FilePayloadStore)
    fs = open_payload_store((tmp_path / "b").as_uri())
    assert isinstance(fs, FilePayloadStore) and fs.root == (tmp_path / "b").resolve()
    monkeypatch.setenv("NOETL_DAGSTER_HOME", str(tmp_path / "home"))
    assert open_payload_store().root == (tmp_path / "home" / "payloads").resolve()
    endpoint, bucket, _ = s3_bucket
    s3 = open_payload_store(f"s3://{bucket}/pre?endpoint_url={endpoint}&key=testing&secret=testing")
    assert isinstance(s3, S3PayloadStore) and s3.prefix == "pre"
    uri = s3.put_bytes("k.txt", b"hello")
    assert uri == f"s3://{bucket}/pre/k.txt" and s3.get_bytes(uri) == b"hello"
    with pytest.raises(ValueError, match="unknown s3 store parameters"):
        open_payload_store(f"s3://{bucket}?endpoint=x")
    with pytest.raises(ValueError, match="unsupported payload store URL"):
        open_payload_store("gopher://x")


def test_s3_store_can_create_its_bucket(moto_endpoint):
    store = S3PayloadStore(
        "noetl-created-bucket",
        endpoint_url=moto_endpoint,
        key="testing",
        secret="testing",
        create_bucket=True,
    )
    assert store.get_bytes(store.put_bytes("a/b", b"1")) == b"1"


def test_hashing_writer_copies_buffers_the_producer_reuses(tmp_path):
    from noetl_dagster.storage.payload import HashingWriter

    scratch = bytearray(256 * 1024)
    expected = []
    with open(tmp_path / "out.bin", "wb") as f:
        w = HashingWriter(f)
        for i in range(8):  # the producer refills one scratch buffer after every write
            scratch[:] = bytes([i]) * len(scratch)
            w.write(scratch)
            expected.append(bytes(scratch))
        got = w.checksum
    assert got == sha256(b"".join(expected)) == sha256((tmp_path / "out.bin").read_bytes())


def test_uri_for_names_keys_and_prefixes(store):
    prefix = object_prefix("acme", "lab", execution_id="exec_1")
    assert unquote(store.uri_for(prefix)).endswith("/execution=exec_1/")
    uri = store.put_bytes(prefix + "manifest.json", b"{}")
    assert store.uri_for(prefix + "manifest.json") == uri
    with pytest.raises(ValueError):
        store.put_bytes(prefix, b"a key that is a directory")
    with pytest.raises(ValueError):
        store.uri_for("../" + prefix)
