"""kind: duckdb against real DuckDB databases (in-memory and files)."""

from __future__ import annotations

import threading

import duckdb
import pyarrow as pa
import pytest

from noetl_dagster.storage.payload import ChecksumMismatch, ResultRef, is_ref
from noetl_dagster.tools.duckdb_tool import connect, duckdb_tool, load_arrow_result
from noetl_dagster.tools.registry import ToolError, get_tool


def test_registered():
    assert get_tool("duckdb").fn is duckdb_tool


def test_e2e_fixture_shape_create_insert_select_in_one_query(make_ctx):
    out = duckdb_tool(
        {
            "database": ":memory:",
            "query": "CREATE TABLE users (id INTEGER, name VARCHAR, age INTEGER);\n"
            "INSERT INTO users VALUES (1, 'Alice', 30), (2, 'Bob', 25), (3, 'Charlie', 35);\n"
            "SELECT name, age FROM users WHERE age >= 30 ORDER BY age;\n",
        },
        make_ctx(),
    )
    assert out == {
        "rows": [{"name": "Alice", "age": 30}, {"name": "Charlie", "age": 35}],
        "row_count": 2,
        "columns": ["name", "age"],
    }


def test_default_database_is_shared_across_calls_of_one_execution(make_ctx):
    ctx = make_ctx()
    duckdb_tool({"command": "CREATE TABLE t AS SELECT 1 AS a"}, ctx)
    assert duckdb_tool({"query": "SELECT a FROM t"}, ctx)["rows"] == [{"a": 1}]
    with pytest.raises(ToolError, match="Table with name t does not exist"):
        duckdb_tool({"query": "SELECT a FROM t"}, make_ctx())  # another execution, another database


def test_file_database_persists(make_ctx, tmp_path):
    path = tmp_path / "analytics.duckdb"
    ctx = make_ctx()
    out = duckdb_tool(
        {
            "database": str(path),
            "commands": [
                "CREATE TABLE s (k VARCHAR, v DOUBLE)",
                "INSERT INTO s VALUES ('a', 1.5), ('b', 2.5)",
            ],
        },
        ctx,
    )
    assert out == {"rows": [], "row_count": 2, "columns": []}
    ctx.close()
    with duckdb.connect(str(path), read_only=True) as conn:
        assert conn.execute("SELECT sum(v) FROM s").fetchone() == (4.0,)


def test_relative_database_resolves_under_the_data_dir(make_ctx, tmp_path):
    ctx = make_ctx(data_dir=tmp_path / "home")
    duckdb_tool({"database": "db/rel.duckdb", "command": "CREATE TABLE x (a INT)"}, ctx)
    assert (tmp_path / "home" / "db" / "rel.duckdb").exists()


def test_update_and_delete_row_counts_and_returning(make_ctx):
    ctx = make_ctx()
    duckdb_tool({"command": "CREATE TABLE n AS SELECT range AS i FROM range(10)"}, ctx)
    assert duckdb_tool({"command": "UPDATE n SET i = i + 100 WHERE i < 4"}, ctx)["row_count"] == 4
    assert duckdb_tool({"command": "DELETE FROM n WHERE i >= 100"}, ctx)["row_count"] == 4
    out = duckdb_tool({"command": "INSERT INTO n VALUES (42) RETURNING i"}, ctx)
    assert out == {"rows": [{"i": 42}], "row_count": 1, "columns": ["i"]}


def test_params_bind_to_the_last_statement(make_ctx):
    ctx = make_ctx()
    out = duckdb_tool(
        {
            "command": "CREATE TABLE p AS SELECT * FROM (VALUES (1, 'x'), (2, 'y')) v(id, s); SELECT s FROM p WHERE id = ?",
            "params": [2],
        },
        ctx,
    )
    assert out["rows"] == [{"s": "y"}]
    assert duckdb_tool({"query": "SELECT $name AS n", "params": {"name": "it's"}}, ctx)["rows"] == [
        {"n": "it's"}
    ]


def test_types_become_json_values(make_ctx):
    out = duckdb_tool(
        {
            "query": "SELECT DATE '2024-01-02' AS d, 1.25::DECIMAL(5,2) AS m, [1,2] AS l, {'a': 1} AS st, NULL AS z"
        },
        make_ctx(),
    )
    assert out["rows"] == [{"d": "2024-01-02", "m": 1.25, "l": [1, 2], "st": {"a": 1}, "z": None}]


@pytest.mark.parametrize(
    "sql, code",
    [
        ("SELEC 1", "ParserException"),
        ("SELECT * FROM missing_tbl", "CatalogException"),
        ("SELECT 'a'::INT", "ConversionException"),
    ],
)
def test_bad_sql_is_a_non_retryable_error(make_ctx, sql, code):
    with pytest.raises(ToolError) as info:
        duckdb_tool({"query": sql}, make_ctx())
    assert (info.value.kind, info.value.code, info.value.retryable) == ("duckdb_error", code, False)


def test_locked_database_file_is_retryable(make_ctx, tmp_path):
    """A file held by another process cannot be opened: an IOException worth retrying later."""
    import subprocess
    import sys

    path = tmp_path / "locked.duckdb"
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            f"import duckdb,sys,time; c=duckdb.connect({str(path)!r}); print('ok', flush=True); time.sleep(30)",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "ok"
        with pytest.raises(ToolError) as info:
            duckdb_tool({"database": str(path), "query": "SELECT 1"}, make_ctx())
        assert info.value.code == "IOException" and info.value.retryable
    finally:
        holder.kill()
        holder.wait()


def test_missing_sql(make_ctx):
    with pytest.raises(ToolError, match="'command' \\(or 'commands' / 'query'\\) is required"):
        duckdb_tool({"database": ":memory:"}, make_ctx())
    with pytest.raises(ToolError, match="holds no statement"):
        duckdb_tool({"query": "-- nothing"}, make_ctx())


def test_result_over_the_inline_limit_goes_out_as_arrow(make_ctx):
    ctx = make_ctx(inline_limit=64 * 1024)
    out = duckdb_tool({"query": "SELECT range AS id, 'name-' || range AS name FROM range(300000)"}, ctx)
    assert out["row_count"] == 300000 and out["columns"] == ["id", "name"] and is_ref(out["rows"])
    ref = out["rows"]["$ref"]
    assert ref["format"] == "arrow" and ref["rows"] == 300000 and ref["uri"].endswith(".arrow")
    assert ref["size"] < 10_000_000  # columnar, not giant JSON
    table = pa.ipc.open_file(
        pa.BufferReader(ctx.payload_store.get_verified(ResultRef.from_dict(ref)))
    ).read_all()
    assert table.num_rows == 300000 and table.column("name")[-1].as_py() == "name-299999"
    back = load_arrow_result(out, ctx.payload_store)
    assert (
        back["row_count"] == 300000
        and back["columns"] == ["id", "name"]
        and back["rows"][1] == {"id": 1, "name": "name-1"}
    )


def test_small_arrow_but_big_json_also_spills(make_ctx):
    ctx = make_ctx(inline_limit=4096)
    out = duckdb_tool({"query": "SELECT range AS i FROM range(800)"}, ctx)
    assert is_ref(out["rows"]) and out["rows"]["$ref"]["rows"] == 800 == out["row_count"]


def test_arrow_reference_checksum_is_verified(make_ctx):
    ctx = make_ctx(inline_limit=1024)
    out = duckdb_tool({"query": "SELECT range AS i FROM range(5000)"}, ctx)
    path = out["rows"]["$ref"]["uri"][len("file://") :]
    with open(path, "r+b") as f:
        f.seek(100)
        f.write(b"\x00\x01")
    with pytest.raises(ChecksumMismatch):
        load_arrow_result(out, ctx.payload_store)


def test_parallel_calls_on_the_shared_database(make_ctx):
    ctx = make_ctx()
    duckdb_tool({"command": "CREATE TABLE c (i INT)"}, ctx)
    errors: list[BaseException] = []

    def work(k: int):
        try:
            for i in range(20):
                duckdb_tool({"command": "INSERT INTO c VALUES (?)", "params": [k * 100 + i]}, ctx)
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert duckdb_tool({"query": "SELECT count(*) AS n FROM c"}, ctx)["rows"] == [{"n": 120}]


def test_store_without_streaming_writes_still_gets_arrow(make_ctx, tmp_path):
    from noetl_dagster.storage.payload import PayloadStore

    class BytesOnly(PayloadStore):
        name = "bytes-only"

        def __init__(self):
            self.blobs = {}

        def put_bytes(self, key, data):
            self.blobs[key] = data
            return "mem://" + key

        def get_bytes(self, uri):
            return self.blobs[uri[len("mem://") :]]

    ctx = make_ctx(inline_limit=1024)
    ctx.payload_store = BytesOnly()
    out = duckdb_tool({"query": "SELECT range AS i FROM range(5000)"}, ctx)
    assert out["rows"]["$ref"]["store"] == "bytes-only"
    assert load_arrow_result(out, ctx.payload_store)["rows"][-1] == {"i": 4999}


@pytest.mark.parametrize(
    "database",
    ["x://../../other.duckdb", "~/other.duckdb", ":memory:/../../other.duckdb", "link.duckdb",
     "sub/../../other.duckdb", "{other}"],
)  # fmt: skip
def test_a_sandboxed_database_file_stays_in_the_sandbox_whatever_its_spelling(make_ctx, tmp_path, database):
    """The tool's own check, below the trust gate: DuckDB opens the database file before its
    ``allowed_directories`` applies, so a spelling the gate lets through (a symlink here) must not
    reach another tenant's file, nor create one outside."""
    other = tmp_path / "other.duckdb"
    with duckdb.connect(str(other)) as g:
        g.execute("CREATE TABLE payroll AS SELECT 'globex-payroll-42' AS s")
    scope = tmp_path / "scope"
    scope.mkdir()
    (scope / "link.duckdb").symlink_to(other)
    ctx = make_ctx(data_dir=scope)
    ctx.scope_dir = str(scope)
    before = sorted(tmp_path.rglob("*"))
    with pytest.raises(ToolError) as e:
        duckdb_tool({"database": database.format(other=other), "command": "SELECT s FROM payroll"}, ctx)
    assert e.value.kind == "trust_refused" and "outside this execution's directory" in e.value.message
    assert sorted(tmp_path.rglob("*")) == before


def test_a_sandboxed_connection_spills_inside_the_sandbox(tmp_path, monkeypatch):
    """DuckDB allows its temp directory implicitly; by default that is ``.tmp`` in the worker's cwd,
    a place every execution shares."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / ".tmp").mkdir()
    (tmp_path / ".tmp" / "left.csv").write_text("s\nother-tenant\n")
    (tmp_path / "scope").mkdir()
    conn = connect(":memory:", str(tmp_path / "scope"))
    with pytest.raises(duckdb.Error, match="disabled by configuration"):
        conn.execute(f"SELECT * FROM read_csv('{tmp_path}/.tmp/left.csv')").fetchall()
    conn.execute(f"COPY (SELECT 1 AS a) TO '{tmp_path}/scope/mine.csv'")  # its own directory still works
    assert conn.execute(f"SELECT a FROM read_csv('{tmp_path}/scope/mine.csv')").fetchall() == [(1,)]
