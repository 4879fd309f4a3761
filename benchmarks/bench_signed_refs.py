"""What signed references (issue 41 part 2) cost an offload and a read back.

Times, in CPU seconds of this process (``time.process_time``), ``Locator.sign`` against the offload
it follows (``Offloader.maybe_offload``, which includes it, of the smallest value offloaded: just over the
64 KiB inline limit, the worst ratio) and ``Locator.authorize`` against the read it precedes
(``Locator.read``, which authorizes, reads and verifies), on a file payload store. Prints the
ratios; they stay small because a capability is one HMAC-SHA256 over ~300 bytes.

Run: ``python -m benchmarks.bench_signed_refs [--n 2000]``.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=2000)
    args = parser.parse_args()
    os.environ["NOETL_DAGSTER_HOME"] = tempfile.mkdtemp(prefix="bench-signed-refs-")
    from noetl_dagster.storage.offload import Offloader
    from noetl_dagster.storage.payload import ResultRef, open_payload_store

    store = open_payload_store(Path(os.environ["NOETL_DAGSTER_HOME"]) / "payloads")
    off = Offloader(store)
    value = {"v": "x" * (66 * 1024)}
    envs = []
    t = time.process_time()
    for i in range(args.n):
        off._last = None  # noqa: SLF001 - each offload writes (not the live-object shortcut)
        envs.append(off.maybe_offload(value, f"acme/default/e/s/r-{i}", owner=("acme", "default")))
    offload = time.process_time() - t
    refs = [ResultRef.from_dict(e["$ref"]) for e in envs]
    loc = off.locator
    t = time.process_time()
    for r in refs:
        loc.sign(r, "acme", "default")
    sign = time.process_time() - t
    t = time.process_time()
    for r in refs:
        loc.authorize(r, "acme", "default")
    authorize = time.process_time() - t
    t = time.process_time()
    for r in refs:
        loc.read(r, "acme", "default")
    read = time.process_time() - t
    per = 1e6 / args.n
    print(json.dumps({"n": args.n, "sign_us": round(sign * per, 1), "authorize_us": round(authorize * per, 1),
                      "offload_us": round(offload * per, 1), "read_us": round(read * per, 1),
                      "sign_per_offload": round(sign / offload, 4),
                      "authorize_per_read": round(authorize / read, 4)}))  # fmt: skip


if __name__ == "__main__":
    main()
