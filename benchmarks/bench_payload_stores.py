"""Payload store throughput per adapter (issue 33): file, S3 (moto's server), GCS
(gcp-storage-emulator) and Azure Blob (Azurite), each emulator a real process on 127.0.0.1 as in
the compliance suite. Writes are streamed through the store's hashing writer (what a big result or
a table file takes), reads are verified (sha256); figures are MB/s and the ratio to the file adapter.

``python -m benchmarks.bench_payload_stores [--mb 64] [--object-mb 16] [--repeat 3]``
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
import uuid
from pathlib import Path

from noetl_dagster.storage.payload import open_payload_store


def _store(kind: str, emu, root: Path):
    if kind == "file":
        return open_payload_store(f"file://{root / 'payloads'}")
    return open_payload_store(emu.store_url(f"bench-{uuid.uuid4().hex[:8]}"), **emu.store_options())


def _round(store, blobs: list[bytes], chunk: int) -> tuple[float, float]:
    t0 = time.perf_counter()
    refs = []
    for i, blob in enumerate(blobs):
        with store.writer(f"bench/{i}.bin") as w:
            for off in range(0, len(blob), chunk):
                w.write(blob[off : off + chunk])
        refs.append((w.uri, w.checksum))
    t1 = time.perf_counter()
    for uri, checksum in refs:
        store.read_verified(uri, checksum)
    t2 = time.perf_counter()
    for uri, _ in refs:
        store.delete(uri)
    return t1 - t0, t2 - t1


def main(argv: list[str] | None = None) -> None:
    from tests.storage.emulators import Emulator  # noqa: PLC0415 - the suite's process launcher

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=int, default=64, help="MiB written and read per round")
    ap.add_argument("--object-mb", type=int, default=16, help="MiB per object")
    ap.add_argument("--repeat", type=int, default=3, help="rounds; the best is reported")
    ap.add_argument("--only", action="append", default=[], help="file, s3, gcs or azure (repeatable)")
    args = ap.parse_args(argv)
    kinds = args.only or ["file", "s3", "gcs", "azure"]
    n = max(1, args.mb // args.object_mb)
    blobs = [os.urandom(args.object_mb << 20) for _ in range(n)]
    total = n * args.object_mb * (1 << 20) / 1e6
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for kind in kinds:
            emu = None if kind == "file" else Emulator(kind, Path(tmp) / kind).start()
            try:
                store = _store(kind, emu, Path(tmp))
                best_w = best_r = float("inf")
                for _ in range(args.repeat):
                    w, r = _round(store, blobs, 1 << 20)
                    best_w, best_r = min(best_w, w), min(best_r, r)
                rows.append((kind, total / best_w, total / best_r))
            finally:
                if emu is not None:
                    emu.stop()
    base = {k: (w, r) for k, w, r in rows}.get("file")
    print(
        f"payload stores: {n} x {args.object_mb} MiB per round, best of {args.repeat}; streamed write, verified read"
    )
    print(f"{'adapter':<8} {'write MB/s':>11} {'read MB/s':>10} {'write/file':>11} {'read/file':>10}")
    for kind, w, r in rows:
        rel = f"{w / base[0]:>11.3f} {r / base[1]:>10.3f}" if base else ""
        print(f"{kind:<8} {w:>11.1f} {r:>10.1f} {rel}")


if __name__ == "__main__":
    main()
