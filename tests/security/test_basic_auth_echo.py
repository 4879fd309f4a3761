"""Issue 14.6: a real local HTTP server echoes the request headers back; the
Basic credentials (base64 of user:password) must not reach the event log.

The user name is ``bob``: ``bob:`` is 4 bytes, so base64(user:password) does not
contain base64(password), which the redactor knows anyway. (With ``alice:``, 6
bytes, it does, and this test passed without the fix it guards.)"""

from __future__ import annotations

import base64
import json

from werkzeug import Response

from noetl_dagster.runners.local import run_playbook
from noetl_dagster.storage.events import SqliteEventStore

PB = """\
apiVersion: noetl.io/v2
kind: Playbook
metadata:
  name: echo_basic
  path: tests/echo_basic
workflow:
  - step: start
    tool:
      kind: http
      method: GET
      url: "{url}"
      auth:
        type: basic
        username: bob
        password: hunter2-secret
"""


def test_basic_auth_echo_not_recorded(tmp_path, httpserver):
    httpserver.expect_request("/echo").respond_with_handler(
        lambda req: Response(json.dumps({"headers": dict(req.headers)}), content_type="application/json")
    )
    pb = tmp_path / "pb.yaml"
    pb.write_text(PB.format(url=httpserver.url_for("/echo")))
    r = run_playbook(pb, data_dir=tmp_path)
    assert r.status == "completed", r.results
    store = SqliteEventStore(tmp_path / "events.db")
    blob = json.dumps([e.to_dict() for e in store.read(r.execution_id)])
    store.close()
    basic = base64.b64encode(b"bob:hunter2-secret").decode()
    assert basic in str(httpserver.log[0][0].headers)  # the server received the credentials
    assert "Basic ***" in blob  # the echo is there, redacted
    for form in ("hunter2-secret", basic):
        assert form not in blob
        assert form not in json.dumps(r.to_json())
