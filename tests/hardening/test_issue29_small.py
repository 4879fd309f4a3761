"""Issue 29, item 6 ("smaller"): each case here hung, crashed, leaked or was wrongly accepted
before; each is now refused or handled at the one gate every path goes through."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hardening_helpers import HEAD, invoke, run_subprocess, write

from noetl_dagster.dsl.loader import YamlLimitError, YamlSyntaxError, load_yaml_file, load_yaml_text

OK = HEAD + "workflow:\n  - step: start\n    tool: {kind: noop}\n"

# -- the one bounded reader ------------------------------------------------------------------


def _commands(tmp: Path, bad: str) -> list[list[str]]:
    """Every command that reads a file it is given, pointed at ``bad``."""
    ok = write(tmp, "ok.yaml", OK)
    (tmp / "corpus").mkdir(exist_ok=True)
    return [
        ["validate", bad],
        ["run", "-q", bad, "--data-dir", str(tmp / "d")],
        ["run", "-q", ok, "--workload", "@" + bad, "--data-dir", str(tmp / "d")],
        ["migrate", bad],
        ["flow", "compile", bad],
        ["lineage", "validate", bad],
        ["conformance", str(tmp / "corpus"), "--core", bad, "--no-run"],
    ]


@pytest.mark.parametrize("kind", ["fifo", "device"])
def test_every_command_refuses_a_fifo_or_a_device_in_one_line(tmp_path, kind):
    """`migrate /dev/zero` read 3.7 GB into a MemoryError and `migrate FIFO` hung; `validate`
    called a FIFO "no such file". Now every command refuses both at once: one line, exit 2."""
    if kind == "fifo":
        bad = str(tmp_path / "pipe.yaml")
        os.mkfifo(bad)  # no writer: opening it for reading blocks for ever
    else:
        bad = "/dev/zero"  # endless
    for args in _commands(tmp_path, bad):
        code, out, _ = run_subprocess(args, timeout=60)
        assert code == 2, (args, out)
        assert "not a regular file" in out and bad in out, (args, out)
        assert len(out.strip().splitlines()) == 1, (args, out)


def test_files_a_run_reads_on_its_own_go_through_the_reader_too(tmp_path):
    """A step's `script:` and the credentials file: a FIFO would hang the run, /dev/zero exhaust it."""
    import json

    from noetl_dagster.engine.keychain import FileProvider, KeychainError

    pipe = str(tmp_path / "pipe")
    os.mkfifo(pipe)
    f = write(
        tmp_path, "p.yaml", HEAD + f"workflow:\n  - step: start\n    tool: {{kind: python, script: {pipe}}}\n"
    )
    code, out, _ = run_subprocess(["run", "-q", "--json", f, "--data-dir", str(tmp_path / "d")], timeout=60)
    error = json.loads(out)["results"]["start"]["error"]
    assert (
        code == 1
        and error["kind"] == "config_error"
        and "FIFO (named pipe), not a regular file" in error["message"]
    )
    for bad in (pipe, "/dev/zero"):
        with pytest.raises(KeychainError, match="not a regular file"):
            FileProvider(bad).credential("x")


def test_the_reader_bounds_what_it_reads_not_what_stat_says(tmp_path):
    """/proc files report size 0; a file may grow after stat: at most limit + 1 bytes are read."""
    from noetl_dagster.dsl.files import InputFileError, read_bounded

    with pytest.raises(InputFileError) as e:
        read_bounded("/proc/self/status", 10)
    assert e.value.rule == "max-bytes"
    assert read_bounded(write(tmp_path, "a.txt", "abc"), 3) == b"abc"
    with pytest.raises(InputFileError) as e:
        read_bounded(write(tmp_path, "b.txt", "abcd"), 3)
    assert e.value.rule == "max-bytes"
    with pytest.raises(InputFileError) as e:
        read_bounded(tmp_path, 3)
    assert e.value.rule == "not-a-file" and "directory" in str(e.value)
    with pytest.raises(InputFileError) as e:
        read_bounded(tmp_path / "absent", 3)
    assert e.value.rule == "file-not-found"


def test_an_oversize_workload_file_is_refused_before_it_is_read(tmp_path, monkeypatch):
    from noetl_dagster.commands import core

    monkeypatch.setattr(core, "WORKLOAD_FILE_MAX_BYTES", 100)
    w = write(tmp_path, "w.json", '{"x": "' + "a" * 200 + '"}')
    r = invoke(["run", "-q", write(tmp_path, "ok.yaml", OK), "--workload", "@" + w,
                "--data-dir", str(tmp_path / "d")])  # fmt: skip
    assert r.exit_code == 2 and "the limit is 100" in r.output and len(r.output.strip().splitlines()) == 1


# -- duplicate keys --------------------------------------------------------------------------


DUP = (
    HEAD
    + "workload: {a: 1}\nworkflow:\n  - step: start\n    tool: {kind: noop}\n    tool: {kind: python, code: x}\n"
)


def test_a_duplicate_key_is_refused_with_file_line_and_rule(tmp_path):
    """PyYAML kept the last `tool:` silently; the playbook meant two things."""
    f = write(tmp_path, "dup.yaml", DUP)
    r = invoke(["validate", f])
    assert r.exit_code == 1
    assert (
        r.output.strip()
        == f"{f}:8: duplicate-key: workflow[0].tool: given twice in this mapping (first at line 7)"
    )
    code, out, _ = run_subprocess(["run", "-q", f, "--data-dir", str(tmp_path / "d")])
    assert code == 2 and f"{f}:8: duplicate-key:" in out and len(out.strip().splitlines()) == 1
    with pytest.raises(YamlSyntaxError) as e:
        load_yaml_text("a: 1\nb: 2\na: 3\n")
    assert e.value.rule == "duplicate-key" and e.value.line == 3
    # a merge key is not a duplicate: keys written beside `<<` override the merged ones
    data, _ = load_yaml_text("base: &b {k: 1, j: 1}\nother: {<<: *b, k: 2}\n")
    assert data["other"] == {"k": 2, "j": 1}


def test_the_conformance_corpus_has_no_duplicate_keys(conformance_dir):
    """Every corpus file still loads through the stricter loader (none repeats a key)."""
    files = [
        p
        for p in Path(conformance_dir).parents[2].rglob("*")
        if p.suffix in (".yaml", ".yml") and p.is_file()
    ]
    assert len(files) >= 163
    for p in files:
        try:
            load_yaml_file(p)
        except YamlSyntaxError as e:  # a file-level or syntax refusal, named with its rule
            assert e.rule not in ("duplicate-key", "yaml-limit"), str(e)


# -- the expanded size of aliases ------------------------------------------------------------


def _aliased_scalar(tmp: Path) -> str:
    """330 KB: a 300 KB scalar aliased 9,999 times (under max-bytes, max-aliases and max-alias-nodes)."""
    refs = ", ".join(["*big"] * 9_999)
    text = HEAD + f"workload:\n  big: &big '{'x' * 300_000}'\n  copies: [{refs}]\n" + OK[len(HEAD) :]
    return write(tmp, "aliases.yaml", text)


def test_aliases_that_expand_past_the_text_limit_are_refused_before_building(tmp_path):
    """It passed every YAML limit, then `run` died with SIGSEGV in the event encoder (3 GB of text)."""
    f = _aliased_scalar(tmp_path)
    assert 300_000 < os.path.getsize(f) < 4 * 1024 * 1024
    with pytest.raises(YamlLimitError) as e:
        load_yaml_file(f)
    assert e.value.limit == "max-expanded-chars"
    for args, want in ((["validate", f], 1), (["run", "-q", f, "--data-dir", str(tmp_path / "d")], 2)):
        code, out, _ = run_subprocess(args, timeout=60)
        assert code == want and "yaml-limit: max-expanded-chars" in out, out
        assert len(out.strip().splitlines()) == 1
    # within the limit aliases still work (the same text counted once per use)
    data, _ = load_yaml_text("a: &a 'xyz'\nb: [*a, *a]\n")
    assert data["b"] == ["xyz", "xyz"]


# -- usage errors: one line ------------------------------------------------------------------


@pytest.mark.parametrize(
    "args,registry,needle",
    [
        (["bogus"], False, "No such command 'bogus'"),
        (["--bogus"], False, "No such option '--bogus'"),
        (["run"], False, "Missing argument 'FILE'"),
        (["run", "x.yaml", "--bogus"], False, "No such option '--bogus'"),
        (["run", "x.yaml", "--runner", "nope"], False, "Invalid value for '--runner'"),
        (["executions", "--limit", "0"], False, "Invalid value for '--limit'"),
        (["validate", "/"], False, "is a directory"),
        (["flow", "compile"], False, "Missing argument 'FILE'"),
        (["lineage", "validate"], False, "Missing argument 'FILES...'"),
        (["facts", "bogus"], False, "No such command 'bogus'"),
        (["dashboard", "serve", "--export-every", "-1"], False, "Invalid value for '--export-every'"),
        (["conformance", "/", "--http-override", "nohost"], False, "expected HOST=URL"),
        (["bogus"], True, "No such command 'bogus'"),
        (["serve", "--port", "0"], True, "Invalid value for '--port'"),
        (["keys", "create"], True, "Missing option '--tenant'"),
        (["keys", "create", "--tenant", "a", "--bogus"], True, "No such option '--bogus'"),
    ],
)
def test_every_usage_error_is_one_line_exit_2(args, registry, needle):
    """Click printed `Usage: …`, `Try '… --help' for help.`, a blank line and `Error: …`."""
    r = invoke(args, registry=registry)
    lines = r.output.strip().splitlines()
    assert r.exit_code == 2 and len(lines) == 1, r.output
    assert lines[0].startswith("error: ") and needle in lines[0] and "--help" in lines[0], r.output


def test_usage_errors_of_the_console_scripts_are_one_line():
    for args, registry in ((["run", "--nope"], False), (["keys", "revoke"], True)):
        code, out, _ = run_subprocess(args, registry=registry)
        assert code == 2 and len(out.strip().splitlines()) == 1 and out.startswith("error: "), out


# -- one rule for scopes and segments ---------------------------------------------------------


@pytest.mark.parametrize("tenant", ["acme.", "a.b", "x" * 65])
def test_run_scope_options_follow_the_locator_rule(tmp_path, tenant):
    """`run --tenant acme.` was accepted, then no resource URI of that run could name its tenant."""
    from noetl_dagster.dsl.locator import InvalidLocator, check_scope
    from noetl_registry.client import open_registry

    with pytest.raises(InvalidLocator):
        check_scope(tenant)
    r = invoke(["run", write(tmp_path, "ok.yaml", OK), "--tenant", tenant, "--data-dir", str(tmp_path / "d")])
    assert (
        r.exit_code == 2
        and "Invalid value for '--tenant'" in r.output
        and len(r.output.strip().splitlines()) == 1
    )
    with pytest.raises(InvalidLocator):
        open_registry(f"sqlite:///{tmp_path}/r.db", tenant=tenant)


# -- lone surrogates: the same text live and in replay -----------------------------------------


SURROGATES = (
    HEAD
    + r"""workflow:
  - step: start
    tool: {kind: noop, result: {got: "{{ workload.x }}", n: "{{ workload.x | length }}", keys: "{{ workload | list }}"}}
    next: {arcs: [{step: py}]}
  - step: py
    tool:
      kind: python
      code: "result = {'k\\udcff': 'v\\ud800', 'big': '\\udcff' + 'x' * 100000}"
    next: {arcs: [{step: use}]}
  - step: use
    tool: {kind: noop, result: {head: "{{ py.big[:2] }}", n: "{{ py.big | length }}", v: "{{ py['k\ufffd'] }}"}}
"""
)


def test_a_lone_surrogate_is_the_same_text_live_and_in_replay(tmp_path):
    """A `--workload` JSON escape "\\ud800" (or a tool's result holding one) stayed raw in the live
    run while the log kept U+FFFD, so `replay` differed. The recorder now applies the log's rule
    before the live state sees the value: every path (workload, inline and offloaded results,
    dict keys) holds U+FFFD in both."""
    import json

    from noetl_dagster.engine.replay import diff_snapshots, replay
    from noetl_dagster.runners import local as runner

    live: list = []
    hook = lambda engine: live.append((engine.execution_id, engine.state.snapshot()))  # noqa: E731
    runner.FINISHED_HOOKS.append(hook)
    try:
        f = write(tmp_path, "s.yaml", SURROGATES)
        d = str(tmp_path / "d")
        r = invoke(
            ["run", "-q", "--json", f, "--workload", '{"x": "\\ud800z", "k\\udfff": 1}', "--data-dir", d]
        )
    finally:
        runner.FINISHED_HOOKS.remove(hook)
    assert r.exit_code == 0, r.output
    out = json.loads(r.output)
    assert out["results"]["start"] == {"got": "\ufffdz", "n": 2, "keys": ["x", "k\ufffd"]}
    assert out["results"]["py"]["k\ufffd"] == "v\ufffd"
    assert out["results"]["use"] == {"head": "\ufffdx", "n": 100_001, "v": "v\ufffd"}
    ((execution_id, snapshot),) = live
    services = runner.build_services(data_dir=d)  # a fresh reader: nothing cached from the live run
    assert (
        diff_snapshots(snapshot, replay(services.event_store, execution_id, services.offloader).snapshot())
        == []
    )
    # replay prints stored results as summaries unless asked for the bodies (issue 33)
    again = json.loads(invoke(["replay", execution_id, "--json", "--bodies", "--data-dir", d]).output)
    assert again["results"] == out["results"] and again["ctx"] == out["ctx"]
    assert [r["status"] for r in again["references"]] == ["ok"]
