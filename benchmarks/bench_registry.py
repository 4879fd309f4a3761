"""Registry benchmarks (issue 9): resolve latency p50 / p99, in-process and over HTTP on loopback.

1. In-process: ``client.resolve(uri)`` on the embedded SQLite registry (and on the
   Postgres server when reachable), owner reading its own resource, next to the
   floor: the same point lookup as one raw SQL query on the same database.
   Target p50 <= 0.2 ms (SQLite).
2. HTTP: ``noetl-registry serve`` in a child process (uvicorn, SQLite), an httpx
   client with keep-alive calling ``GET /v1/resources/resolve`` (API-key auth,
   JSON access plan), next to ``GET /healthz`` on the same server (the bare
   HTTP round trip). Target p50 <= 2 ms.
For information: a cross-tenant resolve through a grant (grant lookup + audit write).

Run: ``python -m benchmarks.bench_registry [--n N]`` or ``python -m benchmarks --only registry``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

INPROC_TARGET_MS = 0.2
HTTP_TARGET_MS = 2.0
PG_URL = os.environ.get("NOETL_TEST_PG_URL", "postgresql://postgres@127.0.0.1:5432/postgres")


def _lat(fn: Callable[[], object], n: int) -> tuple[float, float]:
    for _ in range(min(200, n)):
        fn()
    samples = []
    for _ in range(n):
        t0 = time.perf_counter_ns()
        fn()
        samples.append(time.perf_counter_ns() - t0)
    samples.sort()
    return samples[len(samples) // 2] / 1e6, samples[int(len(samples) * 0.99)] / 1e6


def _line(name: str, p50: float, p99: float, base: tuple[float, float] | None, target: float | None) -> None:
    ratio = f"x{p50 / base[0]:5.1f} of baseline p50 {base[0]:.3f} ms" if base else ""
    verdict = (
        "" if target is None else ("PASS" if p50 <= target else "MISS") + f" (target p50 <= {target} ms)"
    )
    print(f"  {name:<40} p50 {p50:7.3f} ms  p99 {p99:7.3f} ms  {ratio}  {verdict}")


def _seed(registry, tenant: str = "bench", project: str = "lab") -> str:
    from noetl_registry.models import LocationIn, Principal, RegisterRequest

    owner = Principal(tenant=tenant, project=project)
    uri = f"noetl://{tenant}/{project}/bench/dataset/resolve_me"
    for i in range(3):  # a few versions and a replica, like a real series
        r = registry.register(
            owner,
            RegisterRequest(
                uri=uri,
                locations=[
                    LocationIn(
                        uri=f"file:///data/v{i}.parquet",
                        checksum="sha256:" + "a" * 64,
                        size_bytes=1000,
                        format="parquet",
                        rows=10,
                    ),
                    LocationIn(uri=f"s3://replica/v{i}.parquet", region="use1"),
                ],
            ),
        )
    return r.uri


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="registry resolve latency")
    ap.add_argument("--n", type=int, default=5000, help="resolves per measurement")
    args = ap.parse_args(argv)

    import httpx

    from noetl_registry.client import HttpRegistryClient, open_registry
    from noetl_registry.service import Registry

    tmp = Path(tempfile.mkdtemp(prefix="bench_registry_"))
    print(f"bench_registry: {args.n} resolves per figure, load average {os.getloadavg()[0]:.2f}")
    try:
        db = tmp / "registry.db"
        registry = Registry(f"sqlite:///{db}")
        uri = _seed(registry)
        client = open_registry(registry, tenant="bench", project="lab")
        raw = sqlite3.connect(db, check_same_thread=False)
        base = _lat(
            lambda: raw.execute("SELECT * FROM registry_resource WHERE uri = ?", (uri,)).fetchone(), args.n
        )
        print("in-process")
        _line("raw sqlite point lookup (floor)", *base, None, None)
        _line("resolve, sqlite", *_lat(lambda: client.resolve(uri), args.n), base, INPROC_TARGET_MS)
        _line("resolve @latest, sqlite", *_lat(lambda: client.resolve(uri.split("@")[0]), args.n), base, None)
        key_owner = open_registry(registry, tenant="bench", project="lab")
        key_owner.grant(uri, "tenant:partner")
        partner = open_registry(registry, tenant="partner", project="x")
        _line(
            "resolve via grant (+audit), sqlite",
            *_lat(lambda: partner.resolve(uri), max(200, args.n // 5)),
            base,
            None,
        )

        try:
            import psycopg

            name = f"noetl_bench_registry_{os.getpid()}"
            with psycopg.connect(PG_URL, autocommit=True, connect_timeout=3) as conn:
                conn.execute(f'CREATE DATABASE "{name}"')
            pg_url = PG_URL.rsplit("/", 1)[0] + "/" + name
            try:
                pg = Registry(pg_url)
                pg_uri = _seed(pg)
                pg_client = open_registry(pg, tenant="bench", project="lab")
                with psycopg.connect(pg_url, autocommit=True) as conn:
                    pg_base = _lat(
                        lambda: conn.execute(
                            "SELECT * FROM registry_resource WHERE uri = %s", (pg_uri,)
                        ).fetchone(),
                        args.n,
                    )
                _line("raw postgres point lookup (floor)", *pg_base, None, None)
                _line("resolve, postgres", *_lat(lambda: pg_client.resolve(pg_uri), args.n), pg_base, None)
                pg.close()
            finally:
                with psycopg.connect(PG_URL, autocommit=True) as conn:
                    conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        except Exception as e:  # noqa: BLE001 - Postgres is optional for this benchmark
            print(f"  (postgres skipped: {e})")

        print("http (uvicorn child process, loopback, keep-alive)")
        key_id, key = registry.create_api_key("bench", "lab")
        registry.close()
        port = _free_port()
        root = Path(__file__).resolve().parents[1]
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "noetl_registry.cli",
                "serve",
                "--db",
                f"sqlite:///{db}",
                "--port",
                str(port),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
            env={**os.environ, "PYTHONPATH": str(root)},
        )
        try:
            base_url = f"http://127.0.0.1:{port}"
            deadline = time.monotonic() + 60
            while True:
                try:
                    if httpx.get(f"{base_url}/healthz", timeout=1).status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("registry server did not start")
                time.sleep(0.1)
            http = HttpRegistryClient(base_url, key)
            raw_http = httpx.Client(base_url=base_url)
            n = max(500, args.n // 2)
            hbase = _lat(lambda: raw_http.get("/healthz"), n)
            _line("GET /healthz (bare round trip)", *hbase, None, None)
            _line("resolve over HTTP", *_lat(lambda: http.resolve(uri), n), hbase, HTTP_TARGET_MS)
            http.close()
            raw_http.close()
        finally:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
