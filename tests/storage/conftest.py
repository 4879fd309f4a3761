"""Fixtures for storage tests: a real moto S3 server on loopback."""

from __future__ import annotations

import socket
import uuid

import pytest


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def moto_endpoint():
    """moto in server mode (a real HTTP S3 endpoint) on a free loopback port."""
    from moto.server import ThreadedMotoServer

    port = _free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    yield f"http://127.0.0.1:{port}"
    server.stop()


@pytest.fixture
def s3_bucket(moto_endpoint):
    """A fresh bucket; returns (endpoint, bucket, storage options)."""
    import boto3

    bucket = f"noetl-test-{uuid.uuid4().hex[:12]}"
    boto3.client(
        "s3", endpoint_url=moto_endpoint, aws_access_key_id="testing", aws_secret_access_key="testing",
        region_name="us-east-1",
    ).create_bucket(Bucket=bucket)
    return moto_endpoint, bucket, {"endpoint_url": moto_endpoint, "key": "testing", "secret": "testing"}
