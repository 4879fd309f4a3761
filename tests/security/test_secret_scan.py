"""Issue 14.6: a secret scan over everything a run leaves behind.

A real local HTTP server echoes back every request header, the raw query string
and the decoded arguments; a playbook sends it a Basic-auth credential, a token
as a query parameter (percent-encoded on the wire) and the token through
``| b64encode``. Then the event log, the payload store, ``--json`` output, the
command's stderr, every Python log record (caplog, DEBUG, all loggers), the
Dagster instance (its event log on disk, for ``--runner dagster``) and the
archive bundle (every file, zstd segments decompressed) are scanned for each
secret in every form a server may send back: raw, JSON-escaped, base64
(standard, unpadded, urlsafe), percent-encoded (``quote`` and ``quote_plus``)
and the Basic ``base64(user:password)``. Expected: 0 found.

The user name ``bob`` makes ``bob:`` 4 bytes long, so the base64 of
``bob:password`` does not contain the base64 of the password (with a 6-byte
``alice:`` it does, which let a test pass without the Basic-auth fix).
"""

from __future__ import annotations

import base64
import json
import logging
from pathlib import Path
from urllib.parse import quote, quote_plus

import pytest
import zstandard
from click.testing import CliRunner
from werkzeug.wrappers import Request, Response

from noetl_dagster.commands.main import cli
from noetl_dagster.storage.event_stores import open_event_store

USER = "bob"
PASSWORD = "pa@ss/w0rd+Zq&7 x~"  # characters that percent-encoding and base64 both change
TOKEN = "tk/9+Ab=c&d e-77"


def forms(secret: str) -> dict[str, str]:
    raw = secret.encode()
    b64 = base64.b64encode(raw).decode()
    return {
        "raw": secret,
        "json-escaped": json.dumps(secret)[1:-1],
        "base64": b64,
        "base64-unpadded": b64.rstrip("="),
        "base64-urlsafe": base64.urlsafe_b64encode(raw).decode().rstrip("="),
        "percent": quote(secret, safe=""),
        "percent-path": quote(secret),
        "percent-plus": quote_plus(secret),
    }


NEEDLES = {
    **{f"password/{k}": v for k, v in forms(PASSWORD).items()},
    **{f"token/{k}": v for k, v in forms(TOKEN).items()},
    "basic-auth": base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode(),
}


def found_in(text: str | bytes) -> list[str]:
    if isinstance(text, bytes):
        return [name for name, v in NEEDLES.items() if v.encode() in text]
    return [name for name, v in NEEDLES.items() if v in text]


def echo(request: Request) -> Response:
    body = {
        "headers": dict(request.headers),
        "query_string": request.query_string.decode(),
        "url": request.url,
        "args": request.args.to_dict(),
    }
    return Response(json.dumps(body), content_type="application/json")


PLAYBOOK = """\
apiVersion: noetl.io/v2
kind: Playbook
metadata: {{name: secret_scan, path: tests/secret_scan}}
keychain:
  - name: tok
    kind: credential
    credential: api_token
workflow:
  - step: start
    tool:
      - name: basic
        kind: http
        url: "{url}/basic"
        auth: api_basic
      - name: query_and_b64
        kind: http
        url: "{url}/query"
        headers:
          X-Token-B64: "{{{{ keychain.tok.token | b64encode }}}}"
        params:
          token: "{{{{ keychain.tok.token }}}}"
    next: {{arcs: [{{step: talk}}]}}
  - step: talk
    tool:
      kind: python
      input:
        t: "{{{{ keychain.tok.token }}}}"
      code: |
        import logging
        logging.getLogger("probe").warning("calling with %s", t)
        print("token is", t)
        result = {{"t": t, "echo": "{{{{ start }}}}"}}
"""


@pytest.fixture
def scan_env(tmp_path, httpserver, monkeypatch):
    for path in ("/basic", "/query"):
        httpserver.expect_request(path).respond_with_handler(echo)
    creds = tmp_path / "credentials.json"
    creds.write_text(json.dumps({"credentials": {
        "api_basic": {"type": "basic", "username": USER, "password": PASSWORD},
        "api_token": {"type": "bearer", "token": TOKEN},
    }}))  # fmt: skip
    monkeypatch.setenv("NOETL_CREDENTIALS_FILE", str(creds))
    monkeypatch.setenv("NOETL_DAGSTER_HOME", str(tmp_path / "home"))
    pb = tmp_path / "scan.yaml"
    pb.write_text(PLAYBOOK.format(url=httpserver.url_for("").rstrip("/")))
    return pb, httpserver


def _files(root: Path) -> bytes:
    out = []
    for p in sorted(root.rglob("*")):
        if p.is_file():
            data = p.read_bytes()
            out.append(
                zstandard.ZstdDecompressor().decompressobj().decompress(data) if p.suffix == ".zst" else data
            )
    return b"\n".join(out)


def _run(args: list[str]) -> tuple[int, str, str]:
    r = CliRunner().invoke(cli, args, catch_exceptions=False)
    return r.exit_code, r.stdout, r.stderr


@pytest.mark.parametrize("runner", ["local", "dagster"])
def test_no_secret_form_in_events_logs_json_output_or_archive(
    scan_env, tmp_path, caplog, monkeypatch, runner
):
    pb, server = scan_env
    caplog.set_level(logging.DEBUG)
    if runner == "dagster":
        (tmp_path / "dagster_home").mkdir()
        monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "dagster_home"))
    code, out, err = _run(["run", str(pb), "--json", "--runner", runner])
    assert code == 0, (out, err)
    result = json.loads(out)

    # the server did receive every secret in its derived forms, so the echoes carried them
    sent = " ".join(f"{req.headers} {req.query_string.decode()}" for req, _ in server.log)
    assert NEEDLES["basic-auth"] in sent and NEEDLES["token/base64"] in sent
    assert NEEDLES["token/percent-plus"] in sent or NEEDLES["token/percent"] in sent
    assert result["results"]["talk"]["t"] == "***"  # redacted, not dropped

    leaks: dict[str, list[str]] = {}
    store = open_event_store(None, data_dir=tmp_path / "home")
    try:
        events = store.read(result["execution_id"])
        leaks["events"] = found_in(json.dumps([e.to_dict() for e in events]))
    finally:
        store.close()
    leaks["home (event db, payloads)"] = found_in(_files(tmp_path / "home"))
    leaks["--json output"] = found_in(out)
    leaks["stderr"] = found_in(err)
    leaks["python logs"] = found_in("\n".join(
        f"{r.name} {r.getMessage()} {r.exc_text or ''}" for r in caplog.records))  # fmt: skip
    # the logs were there to scan: httpx's request lines and the step's own warning, redacted
    assert any(r.name == "httpx" and "/query?token=" in r.getMessage() for r in caplog.records)
    assert any(r.name == "probe" and r.getMessage() == "calling with ***" for r in caplog.records)
    if runner == "dagster":
        dagster_files = _files(tmp_path / "dagster_home")
        assert result["execution_id"].encode() in dagster_files  # the instance recorded the run
        leaks["dagster instance"] = found_in(dagster_files)

    code, out, err = _run(["archive", result["execution_id"], "--to", str(tmp_path / "archive"), "--no-registry",
                           "--json"])  # fmt: skip
    assert code == 0, (out, err)
    assert len(list((tmp_path / "archive").rglob("*.zst"))) >= 1
    leaks["archive command output"] = found_in(out + err)
    leaks["archive files"] = found_in(_files(tmp_path / "archive"))

    assert {k: v for k, v in leaks.items() if v} == {}
