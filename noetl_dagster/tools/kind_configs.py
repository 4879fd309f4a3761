"""Typed config models of the built-in kinds beyond the core four (http, SQL, secrets, storage,
qdrant, quantum, flow): imported at the first use of one of them (``tools.configs`` resolves the
names), so a run of core kinds only never defines them (issue 35)."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from noetl_dagster.tools.configs import Auth, Params, Sql, ToolConfig, _f


class HttpConfig(ToolConfig):
    method: str | None = _f("HTTP method, default GET")
    url: str | None = _f("request URL (required, or endpoint)")
    endpoint: str | None = _f("alias of url")
    headers: dict[str, Any] | None = _f("request headers (None values dropped)")
    params: Any = _f("query parameters")
    json_: Any = Field(None, alias="json", description="JSON body")
    payload: Any = _f("request body (alias of json)")
    body: Any = _f("request body (alias of json)")
    form: dict[str, Any] | None = _f("form-encoded body")
    data: Any = _f("NoETL routing: query for GET, JSON body otherwise; {query, body}")
    timeout: float | int | str | dict[str, Any] | None = _f(
        "seconds (default 30) or {connect, read, write, pool}"
    )
    timeout_seconds: float | int | str | None = _f("alias of timeout")
    follow_redirects: bool | str | None = _f("default true")
    verify: bool | str | None = _f("TLS verification, default true")
    verify_ssl: bool | str | None = _f("alias of verify")
    auth: Auth = _f("credential name or inline {type: bearer|basic|header, ...}")


class _SqlConfig(ToolConfig):
    command: Sql = _f("one or more SQL statements (string or list)")
    commands: Sql = _f("alias of command")
    query: Sql = _f("alias of command")
    sql: Sql = _f("alias of command")
    params: Params = _f("bind parameters: a list (positional) or a mapping (named)")


class PostgresConfig(_SqlConfig):
    auth: Auth = _f("credential name, inline mapping or connection string")
    credential: Auth = _f("alias of auth")
    connection_string: str | None = _f("libpq connection string (instead of auth)")
    dsn: str | None = _f("alias of connection_string")
    schema_: str | None = Field(None, alias="schema", description="SET LOCAL search_path for this call")


class DuckdbConfig(_SqlConfig):
    database: str | None = _f("database file (default: per-execution in-memory)")
    db_path: str | None = _f("alias of database")
    path: str | None = _f("alias of database")


class DucklakeConfig(_SqlConfig):
    catalog_connection: str | None = _f(
        "the catalog: a Postgres URL / `postgres:<libpq string>`, or a DuckDB file path"
    )
    auth: Auth = _f("a Postgres credential holding the catalog (instead of catalog_connection)")
    credential: Auth = _f("alias of auth")
    catalog_name: str | None = _f("the name the lake is attached under (default lake)")
    data_path: str | None = _f("where the data files go: a directory or s3://bucket/prefix")
    s3: dict[str, Any] | None = _f(
        "S3 settings {endpoint_url, region, key, secret, path_style} or {credential: name}"
    )
    use_catalog: bool | str | None = _f(
        "run the statements with the lake as the default database (default true)"
    )
    register_: dict[str, Any] | None = Field(
        None,
        alias="register",
        description="record a table's newest snapshot in the registry: {table, uri | resource [, namespace, type, inputs]}",
    )
    data_inlining_row_limit: int | str | None = _f(
        "DuckLake: inserts up to this many rows stay in the catalog"
    )
    memory_limit: str | None = _f("DuckDB memory_limit, e.g. 1GB")
    threads: int | str | None = _f("DuckDB threads")
    create_catalog: bool | str | None = _f("upstream's flag; DuckLake creates a new catalog on first use")


class SecretsConfig(ToolConfig):
    name: str | None = _f("credential / secret name")
    secret: str | None = _f("alias of name")
    secret_name: str | None = _f("alias of name")
    credential: str | None = _f("alias of name")
    auth: str | None = _f("alias of name")
    field: str | None = _f("one field of the record")
    key: str | None = _f("alias of field")


class StorageConfig(ToolConfig):
    op: str | None = _f("write | read (default write)")
    uri: str | None = _f("noetl:// resource URI")
    resource: str | None = _f("resource name (instead of uri)")
    version: Any = _f("resource version to read")
    namespace: str | None = _f("resource namespace (default 'default')")
    type: str | None = _f("resource type (default 'dataset')")
    data: Any = _f("rows to write (records, columns or a $ref)")
    rows: Any = _f("alias of data")
    mode: str | None = _f("append | overwrite (default append)")
    partition_by: Any = _f("partition columns")
    compression: str | None = _f("file compression")
    checksum: str | None = _f("checksum of a parquet/arrow file: sha256 (default) | blake3")
    metadata: dict[str, Any] | None = _f("resource metadata")
    columns: list[str] | None = _f("columns to read")
    partition_key: str | None = _f("read: the newest version recorded for this partition key")
    as_: str | None = Field(None, alias="as", description="records | arrow | ref (read shape)")
    registry: str | None = _f("resource registry URL")
    store: str | None = _f("object store URL")
    catalog: str | None = _f("Iceberg catalog URI")
    catalog_name: str | None = _f("Iceberg catalog name (default noetl)")


class QdrantConfig(ToolConfig):
    operation: str | None = _f("create | upsert | query | delete | retrieve | scroll | info | count")
    op: str | None = _f("alias of operation")
    collection: str | None = _f("collection name")
    collection_name: str | None = _f("alias of collection")
    url: str | None = _f("Qdrant server URL (default: embedded path)")
    path: str | None = _f("embedded Qdrant directory")
    api_key: str | None = _f("API key")
    auth: Auth = _f("credential with url/api_key")
    vectors: Any = _f("vectors to upsert")
    vector: Any = _f("query vector")
    text: Any = _f("text to embed (query) or texts (upsert)")
    filter: Any = _f("payload filter")
    limit: int | str | None = _f("hits / points returned")
    embedding: Any = _f("embedder spec")


class QuantumConfig(ToolConfig):
    operation: str | None = _f("run | submit | status | result | cancel | queue")
    provider: str | None = _f("aer (default) or a provider name")
    backend: str | None = _f("backend name")
    circuit: Any = _f("OpenQASM 2/3 text, {file: path} or {qasm, params}")
    circuit_file: str | None = _f("a .qasm file")
    shots: int | str | None = _f("shots (default 1024)")
    seed: int | str | None = _f("simulator seed")
    job_id: str | None = _f("job id (status/result/cancel)")


class FlowInputConfig(ToolConfig):
    tokens: Any = _f("the step's tokens")
    order: Any = _f("token order")
    merge: Any = _f("merge mode")
    value: Any = _f("a literal value")
    literal: Any = _f("a literal value (not rendered)")
    literal_b64: str | None = _f("base64 JSON literal (not rendered)")


class FlowGuardConfig(ToolConfig):
    path: str | None = _f("JSONPath guard")


class ResourceConfig(ToolConfig):
    op: str | None = _f("load | store")
    uri: str | None = _f("file://, relative path, http(s):// or noetl:// URI")
    value: Any = _f("the value to store")
