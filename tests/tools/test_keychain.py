"""Keychain: providers (env, file, plug-in) and declarations, against real files and a real HTTP server."""

from __future__ import annotations

import json
import sys
import textwrap

import pytest
from jinja2.sandbox import SandboxedEnvironment

from noetl_dagster.engine import keychain as kc
from noetl_dagster.engine.keychain import (
    EnvProvider,
    FileProvider,
    Keychain,
    KeychainError,
    KeychainProvider,
    UnknownCredential,
)

PG_LOCAL = {
    "name": "pg_local",
    "type": "postgres",
    "data": {
        "db_host": "localhost",
        "db_port": "5432",
        "db_user": "noetl",
        "db_password": "s3cret-pw",
        "db_name": "noetl",
    },
}


def test_file_provider_reads_e2e_pg_local_record(tmp_path):
    path = tmp_path / "pg_local.json"
    path.write_text(json.dumps(PG_LOCAL))
    rec = Keychain([], providers=[FileProvider(path)]).credential("pg_local")
    assert rec == {"type": "postgres", **PG_LOCAL["data"]}


@pytest.mark.parametrize(
    "doc",
    [
        {"credentials": {"pg_local": {"type": "postgres", "data": PG_LOCAL["data"]}}},
        {"pg_local": {"type": "postgres", "data": PG_LOCAL["data"]}},
        [PG_LOCAL],
    ],
    ids=["credentials-block", "bare-mapping", "list"],
)
def test_file_provider_shapes_yaml(tmp_path, doc):
    import yaml

    path = tmp_path / "credentials.yaml"
    path.write_text(yaml.safe_dump(doc))
    assert Keychain([], providers=[FileProvider(path)]).credential("pg_local")["db_password"] == "s3cret-pw"


def test_file_provider_directory_of_records(tmp_path):
    (tmp_path / "pg_local.json").write_text(json.dumps(PG_LOCAL))
    (tmp_path / "api.yaml").write_text("name: api\ntype: bearer\ndata: {token: tok-123456}\n")
    keychain = Keychain([], providers=[FileProvider(tmp_path)])
    assert keychain.credential("api") == {"type": "bearer", "token": "tok-123456"}
    assert keychain.credential("pg_local")["db_name"] == "noetl"


def test_file_provider_default_path_from_env(tmp_path, monkeypatch):
    monkeypatch.delenv("NOETL_CREDENTIALS_FILE", raising=False)
    monkeypatch.setenv("NOETL_DAGSTER_HOME", str(tmp_path))
    (tmp_path / "credentials.yaml").write_text(yaml_dump({"credentials": {"c": {"token": "abc-def"}}}))
    assert FileProvider().credential("c") == {"token": "abc-def"}
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"credentials": {"c": {"token": "from-explicit"}}}))
    monkeypatch.setenv("NOETL_CREDENTIALS_FILE", str(other))
    assert FileProvider().credential("c") == {"token": "from-explicit"}


def yaml_dump(doc):
    import yaml

    return yaml.safe_dump(doc)


def test_file_provider_bad_yaml_names_the_line(tmp_path):
    path = tmp_path / "credentials.yaml"
    path.write_text("credentials:\n  a: {type: x\n  b: [\n")
    with pytest.raises(KeychainError, match=r"credentials\.yaml:\d+ is not valid YAML"):
        Keychain([], providers=[FileProvider(path)]).credential("a")


def test_env_provider_json_and_per_field():
    env = {
        "NOETL_CREDENTIAL_PG_LOCAL": json.dumps(PG_LOCAL),
        "NOETL_CREDENTIAL_MY_API_TOKEN": "tok-abcdef",
        "NOETL_CREDENTIAL_MY_API_HEADER": "X-Key",
    }
    keychain = Keychain([], providers=[EnvProvider(env)])
    assert keychain.credential("pg_local")["db_user"] == "noetl"
    assert keychain.credential("my-api") == {"token": "tok-abcdef", "header": "X-Key"}
    assert "tok-abcdef" in keychain.secret_values()
    assert "X-Key" not in keychain.secret_values()


def test_env_provider_rejects_non_json():
    keychain = Keychain([], providers=[EnvProvider({"NOETL_CREDENTIAL_X": "{not json"})])
    with pytest.raises(KeychainError, match="NOETL_CREDENTIAL_X is not valid JSON"):
        keychain.credential("x")


def test_unknown_credential_is_a_clear_key_error(tmp_path):
    keychain = Keychain([], providers=[EnvProvider({}), FileProvider(tmp_path / "none.yaml")])
    with pytest.raises(KeyError) as info:
        keychain.credential("nope")
    assert isinstance(info.value, UnknownCredential)
    assert str(info.value).startswith(
        "unknown credential 'nope': not declared under keychain: and not found in env"
    )
    assert "none.yaml" in str(info.value)


def test_secret_values_cover_passwords_not_plain_fields(tmp_path):
    path = tmp_path / "c.json"
    path.write_text(json.dumps(PG_LOCAL))
    keychain = Keychain([], providers=[FileProvider(path)])
    assert keychain.secret_values() == set()  # lazy: nothing resolved yet
    keychain.credential("pg_local")
    assert keychain.secret_values() == {"s3cret-pw"}


def test_password_inside_a_dsn_is_secret(tmp_path):
    keychain = Keychain(
        [], providers=[EnvProvider({"NOETL_CREDENTIAL_DB_DSN": "postgresql://u:hunter22@h/db"})]
    )
    keychain.credential("db")
    assert keychain.secret_values() == {"hunter22"}


def render(template: str, **names):
    return SandboxedEnvironment().from_string(template).render(**names)


def test_declarations_static_bearer_basic_header():
    keychain = Keychain(
        [
            {"name": "openai_token", "kind": "bearer", "scope": "global", "token": "{{ openai_key }}"},
            {"name": "creds", "kind": "static", "map": {"client_id": "cid-1", "client_secret": "{{ sec }}"}},
            {"name": "b", "kind": "basic", "username": "alice", "password": "pa55word"},
            {"name": "h", "kind": "header", "header": "X-Api-Key", "value": "hk-999"},
        ],
        providers=[],
        context={"openai_key": "sk-live-1234", "sec": "client-secret-xyz"},
    )
    ns = keychain.namespace()
    assert render("{{ keychain.openai_token.token }}", keychain=ns) == "sk-live-1234"
    assert render("{{ keychain.creds.client_id }}/{{ keychain.creds.client_secret }}", keychain=ns) == (
        "cid-1/client-secret-xyz"
    )
    assert keychain.credential("b") == {"type": "basic", "username": "alice", "password": "pa55word"}
    assert keychain.credential("h")["header"] == "X-Api-Key"
    assert keychain.secret_values() == {"sk-live-1234", "client-secret-xyz", "pa55word", "hk-999"}
    assert "sk-live" not in repr(ns)
    assert sorted(ns) == ["b", "creds", "h", "openai_token"]


def test_declarations_render_with_the_workload_and_each_other():
    keychain = Keychain(
        [
            {"name": "base", "kind": "static", "map": {"user": "{{ workload.user }}"}},
            {"name": "derived", "kind": "static", "map": {"greeting": "hi {{ keychain.base.user }}"}},
        ],
        providers=[],
        context={"workload": {"user": "bob"}},
    )
    assert keychain.credential("derived") == {"greeting": "hi bob"}


def test_declaration_cycle_is_reported():
    keychain = Keychain(
        [
            {"name": "a", "kind": "static", "map": {"x": "{{ keychain.b.x }}"}},
            {"name": "b", "kind": "static", "map": {"x": "{{ keychain.a.x }}"}},
        ],
        providers=[],
    )
    with pytest.raises(KeychainError, match="cycle: a -> b -> a"):
        keychain.credential("a")


def test_credential_kind_and_secrets_kind_use_providers():
    env = EnvProvider(
        {
            "NOETL_CREDENTIAL_AUTH0_CLIENT": json.dumps(
                {"type": "oauth", "data": {"client_secret": "auth0-sec-1"}}
            ),
            "OPENAI_API_KEY": "sk-from-env-42",
        }
    )
    keychain = Keychain(
        [
            {"name": "auth0_credentials", "kind": "credential", "credential": "{{ cred }}"},
            {
                "name": "openai_token",
                "kind": "secrets",
                "provider": "env",
                "map": {"api_key": "OPENAI_API_KEY"},
            },
        ],
        providers=[env],
        context={"cred": "auth0_client"},
    )
    assert keychain.credential("auth0_credentials")["client_secret"] == "auth0-sec-1"
    assert keychain.credential("openai_token") == {"api_key": "sk-from-env-42"}
    assert {"auth0-sec-1", "sk-from-env-42"} <= keychain.secret_values()


def test_secrets_kind_from_the_credentials_file_secrets_block(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text(yaml_dump({"secrets": {"projects/1/secrets/openai/versions/1": "sk-file-77"}}))
    keychain = Keychain(
        [
            {
                "name": "t",
                "kind": "secrets",
                "provider": "gcp",
                "map": {"api_key": "projects/1/secrets/openai/versions/1"},
            }
        ],
        providers=[FileProvider(path)],
    )
    assert keychain.credential("t") == {"api_key": "sk-file-77"}


def test_missing_secret_names_entry_field_and_provider_never_a_value(tmp_path):
    keychain = Keychain(
        [
            {
                "name": "t",
                "kind": "secrets",
                "provider": "gcp",
                "auth": "google_oauth",
                "map": {"api_key": "projects/x"},
            }
        ],
        providers=[EnvProvider({}), FileProvider(tmp_path / "absent.yaml")],
    )
    with pytest.raises(
        KeychainError, match=r"keychain 't' \(secrets, provider gcp\): secret for field 'api_key' not found"
    ):
        keychain.credential("t")


def test_unsupported_kind_is_explained_and_lazy():
    keychain = Keychain([{"name": "gid", "kind": "google_id_token", "target_audience": "x"}], providers=[])
    ns = keychain.namespace()  # building the namespace resolves nothing
    with pytest.raises(KeychainError, match="kind 'google_id_token' is not supported here"):
        render("{{ keychain.gid.id_token }}", keychain=ns)


def test_entries_need_names():
    with pytest.raises(KeychainError, match=r"keychain\[1\]: each entry needs a 'name'"):
        Keychain([{"name": "a"}, {"kind": "static"}], providers=[])


def test_oauth2_declaration_fetches_a_token_from_a_real_server(httpserver):
    httpserver.expect_request(
        "/oauth/token", method="POST", data="grant_type=client_credentials&client_id=cid&client_secret=csec-5"
    ).respond_with_json({"access_token": "at-0001-xyz", "token_type": "Bearer", "expires_in": 3600})
    keychain = Keychain(
        [
            {"name": "creds", "kind": "static", "map": {"client_id": "cid", "client_secret": "csec-5"}},
            {
                "name": "tok",
                "kind": "oauth2",
                "endpoint": httpserver.url_for("/oauth/token"),
                "method": "POST",
                "headers": {"Content-Type": "application/x-www-form-urlencoded"},
                "data": {
                    "grant_type": "client_credentials",
                    "client_id": "{{ keychain.creds.client_id }}",
                    "client_secret": "{{ keychain.creds.client_secret }}",
                },
            },
        ],
        providers=[],
    )
    assert render("{{ keychain.tok.access_token }}", keychain=keychain.namespace()) == "at-0001-xyz"
    keychain.credential("tok")  # cached until expiry: one request only
    assert len(httpserver.log) == 1
    assert {"at-0001-xyz", "csec-5"} <= keychain.secret_values()


def test_oauth2_error_status_is_reported_without_the_body(httpserver):
    httpserver.expect_request("/t").respond_with_data("bad client secret csec-9", status=401)
    keychain = Keychain(
        [{"name": "tok", "kind": "oauth2", "endpoint": httpserver.url_for("/t")}], providers=[]
    )
    with pytest.raises(KeychainError) as info:
        keychain.credential("tok")
    assert "HTTP 401" in str(info.value) and "csec-9" not in str(info.value)


def test_plugin_provider_through_entry_points(tmp_path, monkeypatch):
    """A real distribution on sys.path registering a provider in the entry-point group."""
    dist = tmp_path / "noetl_vault_stub-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: noetl-vault-stub\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(
        "[noetl_dagster.keychain_providers]\nvault = noetl_vault_stub:VaultProvider\n"
    )
    (tmp_path / "noetl_vault_stub.py").write_text(
        textwrap.dedent(
            """
            from noetl_dagster.engine.keychain import KeychainProvider

            class VaultProvider(KeychainProvider):
                name = "vault"

                def credential(self, name):
                    return {"token": "vault-" + name} if name.startswith("v_") else None

                def secret(self, ref, *, provider=None, auth=None):
                    return "sec:" + ref if provider == "vault" else None

                def resolve(self, declaration, keychain):
                    if declaration.get("kind") == "google_id_token":
                        return {"id_token": "idt-for-" + declaration["target_audience"]}
                    return None
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    plugins = kc.plugin_providers()
    assert [p.name for p in plugins] == ["vault"]
    keychain = Keychain(
        [
            {"name": "gid", "kind": "google_id_token", "target_audience": "aud1"},
            {"name": "s", "kind": "secrets", "provider": "vault", "map": {"k": "path/1"}},
        ],
        providers=[EnvProvider({}), *plugins],
    )
    assert keychain.credential("v_db") == {"token": "vault-v_db"}
    assert keychain.credential("gid") == {"id_token": "idt-for-aud1"}
    assert keychain.credential("s") == {"k": "sec:path/1"}
    sys.modules.pop("noetl_vault_stub", None)


def test_bad_plugin_is_rejected(tmp_path, monkeypatch):
    dist = tmp_path / "noetl_bad_stub-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: noetl-bad-stub\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[noetl_dagster.keychain_providers]\nbad = noetl_bad_stub:make\n")
    (tmp_path / "noetl_bad_stub.py").write_text("def make():\n    return 42\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(KeychainError, match="plug-in 'bad' did not produce a KeychainProvider"):
        kc.plugin_providers()
    sys.modules.pop("noetl_bad_stub", None)


def test_provider_base_class_declines_everything():
    p = KeychainProvider()
    assert p.credential("x") is None and p.secret("x") is None and p.resolve({}, None) is None


def test_bind_pushes_secrets_to_the_redactor_as_they_resolve():
    seen: list[set[str]] = []
    workload = {"openai_key": "sk-first"}
    keychain = Keychain(
        [
            {"name": "t", "kind": "bearer", "token": "{{ workload.openai_key }}"},
            {"name": "s", "kind": "static", "map": {"password": "pw-abc"}},
        ],
        providers=[],
    )
    keychain.credential("s")
    keychain.bind(context=lambda: {"workload": workload}, on_secret=seen.append)
    assert seen == [{"pw-abc"}]  # already-known secrets are handed over at bind time
    assert keychain.credential("t")["token"] == "sk-first"  # context read when the entry resolves
    assert seen[-1] == {"sk-first"}
    keychain.add_secret("xy")  # too short to scrub: kept, not published
    assert seen[-1] == {"sk-first"} and "xy" not in keychain.secret_values()


def test_bind_uses_the_engine_renderer():
    keychain = Keychain([{"name": "t", "kind": "bearer", "token": "{{ key }}"}], providers=[])
    keychain.bind(
        context={"key": "k-123"},
        render=lambda value, names: {
            k: str(v).replace("{{ key }}", names["key"].upper()) for k, v in value.items()
        },
    )
    assert keychain.credential("t")["token"] == "K-123"
