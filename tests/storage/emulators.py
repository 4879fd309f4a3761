"""Cloud object-store emulators as real processes on 127.0.0.1 (seed 004 F.3): moto's S3 server,
gcp-storage-emulator (GCS JSON API) and Azurite (Azure Blob, from the npm registry, installed into
``.tools/azurite`` by ``make setup`` or, when missing, by :func:`azurite_bin` itself).

Each :class:`Emulator` can be killed (SIGKILL, for failure injection) and restarted on the same port
and data directory; GCS and Azurite keep their objects on disk across a restart, moto does not."""

from __future__ import annotations

import fcntl
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
AZURITE_VERSION = "3.37.0"
# Azurite's well-known development account (public, documented by Microsoft)
AZURITE_ACCOUNT = "devstoreaccount1"
AZURITE_KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def azurite_bin() -> Path:
    """``azurite-blob`` from the project-local npm install (``$NOETL_AZURITE_DIR`` or .tools/azurite),
    installed with npm on first use (under a lock: xdist workers may ask at once)."""
    base = Path(os.environ.get("NOETL_AZURITE_DIR") or REPO / ".tools" / "azurite")
    exe = base / "node_modules" / ".bin" / "azurite-blob"
    if exe.exists():
        return exe
    npm = shutil.which("npm")
    if npm is None:
        raise RuntimeError("Azurite needs npm (make setup installs it); none on PATH")
    base.mkdir(parents=True, exist_ok=True)
    with open(base / ".install.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not exe.exists():
            subprocess.run([npm, "install", "--no-audit", "--no-fund", "--silent", "--prefix", str(base),
                            f"azurite@{AZURITE_VERSION}"], check=True, timeout=600)  # fmt: skip
    return exe


class Emulator:
    """One emulator process; ``kill`` and ``restart`` for failure injection."""

    def __init__(self, kind: str, workdir: Path, *, bucket: str = "noetl-payloads"):
        self.kind = kind
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.bucket = bucket
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        # objects survive a restart (Azurite saves its metadata every few seconds and on a clean stop)
        self.persistent = kind in ("gcs", "azure")

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def connection_string(self) -> str:
        return (f"DefaultEndpointsProtocol=http;AccountName={AZURITE_ACCOUNT};AccountKey={AZURITE_KEY};"
                f"BlobEndpoint={self.endpoint}/{AZURITE_ACCOUNT};")  # fmt: skip

    def _command(self) -> list[str]:
        p = str(self.port)
        if self.kind == "s3":
            return [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", p]
        if self.kind == "gcs":
            exe = Path(sys.executable).with_name("gcp-storage-emulator")
            return [
                str(exe),
                "start",
                "--host",
                "127.0.0.1",
                "--port",
                p,
                "--default-bucket",
                self.bucket,
                "-q",
            ]
        if self.kind == "azure":
            return [str(azurite_bin()), "--blobHost", "127.0.0.1", "--blobPort", p, "--location",
                    str(self.workdir / "azurite"), "--silent", "--skipApiVersionCheck", "--disableTelemetry"]  # fmt: skip
        raise ValueError(self.kind)

    def start(self, timeout: float = 60.0) -> Emulator:
        log = open(self.workdir / f"{self.kind}.log", "ab")  # noqa: SIM115 - the process writes it
        env = {**os.environ, "STORAGE_BASE": str(self.workdir)}  # gcp-storage-emulator's data dir
        self.proc = subprocess.Popen(self._command(), cwd=self.workdir, stdout=log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, env=env, start_new_session=True)  # fmt: skip
        log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"{self.kind} emulator exited: {(self.workdir / f'{self.kind}.log').read_text()[-2000:]}"
                )
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    pass
                if self.kind == "s3":
                    self._s3_bucket()
                return self
            except OSError:
                time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"{self.kind} emulator did not listen on {self.port} within {timeout}s")

    def _s3_bucket(self) -> None:
        import boto3

        client = boto3.client("s3", endpoint_url=self.endpoint, aws_access_key_id="testing",
                              aws_secret_access_key="testing", region_name="us-east-1")  # fmt: skip
        client.create_bucket(Bucket=self.bucket)

    def kill(self) -> None:
        """SIGKILL the emulator's process group (failure injection: no goodbye to clients)."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=30)

    def restart(self) -> Emulator:
        self.kill()
        return self.start()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)
        self.proc = None

    def env(self) -> dict[str, str]:
        """The cloud's standard emulator variables, pointing at this process."""
        if self.kind == "s3":
            return {"AWS_ENDPOINT_URL": self.endpoint, "AWS_ACCESS_KEY_ID": "testing",
                    "AWS_SECRET_ACCESS_KEY": "testing", "AWS_REGION": "us-east-1"}  # fmt: skip
        if self.kind == "gcs":
            return {"STORAGE_EMULATOR_HOST": self.endpoint}
        return {"AZURE_STORAGE_CONNECTION_STRING": self.connection_string}

    def store_url(self, prefix: str = "root") -> str:
        scheme = {"s3": "s3", "gcs": "gs", "azure": "azure"}[self.kind]
        return f"{scheme}://{self.bucket}/{prefix}"

    def store_options(self, *, fail_fast: bool = False) -> dict:
        """Connection options for open_payload_store (``fail_fast``: few retries, for failure injection)."""
        if self.kind == "s3":
            opts: dict = {"endpoint_url": self.endpoint, "key": "testing", "secret": "testing"}
            if fail_fast:
                opts["config_kwargs"] = {
                    "retries": {"max_attempts": 1},
                    "connect_timeout": 2,
                    "read_timeout": 5,
                }
            return opts
        if self.kind == "gcs":
            return {"endpoint_url": self.endpoint}
        opts = {"connection_string": self.connection_string, "create_container": True, "blocksize": 1 << 20}
        if fail_fast:
            opts["retry_total"] = 0
        return opts
