"""Secrets used by a playbook never reach the event log, the payload store or the CLI output.

Real runs of the ``noetl-dagster run`` command against a local echo server (which
sends every header and argument back, so a leaked secret would land in a
result), the real Postgres, and a credentials file — then a byte scan of
everything the run wrote.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from werkzeug.wrappers import Request, Response

from noetl_dagster.storage.feather_events import FeatherEventStore
from noetl_dagster.util.jsonutil import dumps

SECRETS = {
    "api_token": "tok-5ecret-api-7f3a9c",
    "pg_password": "pw-5ecret-pg-41b2",
    "client_secret": "cs-5ecret-oauth-88d1",
    "env_secret": "env-5ecret-key-c0ffee",
}


def echo(request: Request) -> Response:
    body = {
        "headers": dict(request.headers),
        "args": request.args.to_dict(),
        "json": request.get_json(silent=True),
    }
    status = 500 if request.path.endswith("/fail") else 200
    return Response(json.dumps(body), status=status, content_type="application/json")


PLAYBOOK = """
apiVersion: noetl.io/v2
kind: Playbook
metadata: {{name: secrets_probe, path: tests/secrets_probe}}
workload:
  echo_url: "{echo}"
keychain:
  - name: api
    kind: credential
    credential: api_cred
  - name: oauth_client
    kind: static
    map:
      client_id: public-client-id
      client_secret: "{client_secret}"
  - name: from_env
    kind: secrets
    provider: env
    map:
      key: PROBE_ENV_SECRET
workflow:
  - step: start
    tool:
      - name: with_auth
        kind: http
        url: "{{{{ echo_url }}}}/auth"
        auth: api_cred
      - name: with_template_header
        kind: http
        url: "{{{{ echo_url }}}}/template"
        headers:
          X-Client-Secret: "{{{{ keychain.oauth_client.client_secret }}}}"
          X-Env-Key: "{{{{ keychain.from_env.key }}}}"
        params:
          token: "{{{{ keychain.api.token }}}}"
      - name: read_secret
        kind: secrets
        secret_name: pg_secret
        field: db_password
      - name: pg_call
        kind: postgres
        auth: pg_secret
        command: "SELECT 1 AS one"
    next:
      arcs:
        - step: echo_python
  - step: echo_python
    tool:
      kind: python
      input:
        pw: "{{{{ keychain.oauth_client.client_secret }}}}"
        secret_step: "{{{{ start }}}}"
      code: |
        result = {{"seen": pw, "again": secret_step}}
    next:
      arcs:
        - step: fail_loudly
  - step: fail_loudly
    tool:
      kind: python
      input:
        pw: "{{{{ keychain.from_env.key }}}}"
      code: |
        raise RuntimeError("could not use " + pw)
"""


def run_cli(tmp_path: Path, playbook: Path, *args: str) -> subprocess.CompletedProcess:
    creds = tmp_path / "credentials.json"
    creds.write_text(
        json.dumps(
            {
                "credentials": {
                    "api_cred": {"type": "bearer", "token": SECRETS["api_token"]},
                    "pg_secret": {
                        "type": "postgres",
                        "data": {
                            "db_host": "127.0.0.1",
                            "db_port": "5432",
                            "db_user": "postgres",
                            "db_password": SECRETS["pg_password"],
                            "db_name": "postgres",
                        },
                    },
                }
            }
        )
    )
    env = {
        **os.environ,
        "NOETL_CREDENTIALS_FILE": str(creds),
        "NOETL_DAGSTER_HOME": str(tmp_path / "home"),
        "PROBE_ENV_SECRET": SECRETS["env_secret"],
    }
    return subprocess.run(
        [sys.executable, "-m", "noetl_dagster.commands.main", "run", str(playbook), *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )


def everything_written(root: Path) -> bytes:
    return b"".join(p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file())


@pytest.mark.parametrize("json_output", [True, False], ids=["json", "table"])
def test_secrets_never_appear_in_events_payloads_or_output(tmp_path, httpserver, json_output):
    httpserver.expect_request("/auth").respond_with_handler(echo)
    httpserver.expect_request("/template").respond_with_handler(echo)
    playbook = tmp_path / "probe.yaml"
    playbook.write_text(
        textwrap.dedent(
            PLAYBOOK.format(echo=httpserver.url_for("").rstrip("/"), client_secret=SECRETS["client_secret"])
        )
    )
    # the playbook file itself holds client_secret (a static map); everything else comes from providers
    proc = run_cli(tmp_path, playbook, *(["--json"] if json_output else []))
    assert proc.returncode == 1, proc.stderr  # fail_loudly fails the run, after the secrets were used

    # the echo server really received every secret, so the results did carry them
    sent = json.dumps(
        [e[0].headers.items() and dict(e[0].headers) | e[0].args.to_dict() for e in httpserver.log]
    )
    for name in ("api_token", "client_secret", "env_secret"):
        assert SECRETS[name] in sent, name

    written = everything_written(tmp_path / "home")
    # the event log was written (the local mode's files are zstd-compressed: scan the decoded events too)
    local = FeatherEventStore(tmp_path / "home" / "local")
    [eid] = local.execution_ids()
    written += b"".join(dumps(e.to_dict()).encode() for e in local.read(eid))
    assert b"workflow.finished" in written
    outputs = (proc.stdout + proc.stderr).encode()
    for name, value in SECRETS.items():
        assert value.encode() not in written, f"{name} found in the event store / payloads"
        assert value.encode() not in outputs, f"{name} found in the command output"
    if json_output:
        out = json.loads(proc.stdout)
        assert out["results"]["echo_python"]["seen"] == "***"  # redacted, not dropped
