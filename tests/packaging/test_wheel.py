"""The package as users get it: sdist and wheel build, `twine check --strict` and
`check-wheel-contents` pass, the wheel holds the package data, the license files and nothing of the
checkout, the sdist holds the tests, docs and changelog and runs its tests, and the wheel installed
with no extras into a fresh venv stays near Dagster's own footprint (<= 400 MB, <= 70 packages;
issue 44), runs core playbooks locally and on Dagster, loads Definitions, names the extra an
optional capability needs, and lives beside `analytics-python` (Segment's `analytics`).

The fresh venv holds exactly what pip resolves for the wheel from the package index (`pip install
--dry-run --ignore-installed --report`: the core dependencies, no extras). A resolved distribution
already installed at the same version in the test's own venv is linked file by file from it (its
RECORD); the others (a core install resolves newer DuckDB, pandas, Dagster than `[all]` does) and
the wheel itself are installed by pip, and `pip check` proves every requirement is met. Copying
~900 MB of identical files from the index took 80-190 s of a CI run; linking takes ~1 s."""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import threading
import time
import tomllib
import venv
import zipfile
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "example_project" / "playbooks"
# what the sdist is built from (MANIFEST.in picks the same): the packages, their license files, and
# what the tests read
SOURCES = (
    "pyproject.toml",
    "MANIFEST.in",
    "README.md",
    "CHANGELOG.md",
    "LICENSE",
    "NOTICE",
    "Makefile",
    "noetl_dagster",
    "registry_service",
    "lineage",
    "analytics",
    "docs",
    "tests",
    "example_project",
    "benchmarks",
    "deploy",
)
PACKAGES = ("noetl_dagster", "noetl_analytics", "noetl_lineage", "noetl_registry")
# issue 44: Dagster alone is ~156 MB and 50 packages in a fresh venv
CORE_MAX_MB = 400
CORE_MAX_PACKAGES = 70
VERSION = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def dist(tmp_path_factory) -> Path:
    """sdist and wheel built from a copy of the sources (the checkout gets no build/ or egg-info)."""
    src = tmp_path_factory.mktemp("src")
    for name in SOURCES:
        p = REPO / name
        if p.is_dir():
            junk = ("__pycache__", "*.pyc", ".noetl", ".dagster_home", "*.db", ".pytest_cache")
            shutil.copytree(p, src / name, symlinks=True, ignore=shutil.ignore_patterns(*junk))
        else:
            shutil.copy(p, src / name)
    out = src / "dist"
    r = subprocess.run([sys.executable, "-m", "build", "-o", str(out), str(src)], capture_output=True, text=True,
                       timeout=600)  # fmt: skip
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    return out


def _wheel(dist: Path) -> Path:
    (whl,) = dist.glob("*.whl")
    return whl


def _sdist(dist: Path) -> Path:
    (sdist,) = dist.glob("*.tar.gz")
    return sdist


def test_sdist_and_wheel_pass_twine_check_and_check_wheel_contents(dist):
    assert len(list(dist.glob("*.tar.gz"))) == 1
    r = subprocess.run([sys.executable, "-m", "twine", "check", "--strict", *map(str, dist.iterdir())],
                       capture_output=True, text=True, timeout=120)  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.count("PASSED") == 2
    # run from the checkout: [tool.check-wheel-contents] names the four top-level packages
    r = subprocess.run([sys.executable, "-m", "check_wheel_contents", str(_wheel(dist))], cwd=REPO,
                       capture_output=True, text=True, timeout=120)  # fmt: skip
    assert r.returncode == 0 and r.stdout.strip().endswith(": OK"), r.stdout + r.stderr


def test_wheel_holds_package_data_and_nothing_of_the_checkout(dist):
    whl = _wheel(dist)
    assert whl.name == f"noetl_dagster-{VERSION}-py3-none-any.whl"
    names = zipfile.ZipFile(whl).namelist()
    for data in ("noetl_analytics/sql/V001__facts.sql", "noetl_analytics/dashboard_app.js",
                 "noetl_analytics/execution_app.js", "noetl_analytics/grafana/noetl_facts.json",
                 "noetl_analytics/prices.yaml", "noetl_lineage/facets/QuantumJobsRunFacet.json", "noetl_dagster/tools/quantum/qasm/bell.qasm",
                 "noetl_dagster/dsl/flow/grammar.lark", "noetl_dagster/translator/hello_noetl.yaml"):  # fmt: skip
        assert data in names, data
    tops = {n.split("/")[0] for n in names}
    assert tops == {*PACKAGES, f"noetl_dagster-{VERSION}.dist-info"}
    for package in PACKAGES:
        assert f"{package}/py.typed" in names, package
    info = f"noetl_dagster-{VERSION}.dist-info"
    assert zipfile.ZipFile(whl).read(f"{info}/licenses/LICENSE") == (REPO / "LICENSE").read_bytes()
    assert zipfile.ZipFile(whl).read(f"{info}/licenses/NOTICE") == (REPO / "NOTICE").read_bytes()
    bad = [n for n in names if n.endswith((".pyc", ".db", ".parquet")) or "/." in n or "__pycache__" in n]
    assert bad == []
    meta = zipfile.ZipFile(whl).read(f"noetl_dagster-{VERSION}.dist-info/METADATA").decode()
    assert f"Version: {VERSION}" in meta
    assert "Provides-Extra: quantum" in meta and "Provides-Extra: all" in meta
    core = [
        line for line in meta.splitlines() if line.startswith("Requires-Dist:") and "extra ==" not in line
    ]
    for heavy in ("qiskit", "cirq", "chdb", "clickhouse", "matplotlib", "plotly", "qdrant", "dagster-k8s",
                  "fastapi", "uvicorn", "nats-py", "mcp", "duckdb", "polars", "pandas", "pyiceberg", "s3fs",
                  "openlineage", "blake3", "numpy", "[binary]"):  # fmt: skip
        assert not [line for line in core if heavy in line], heavy
    assert "Requires-Dist: psycopg>=3.2" in core and "Requires-Dist: pyarrow>=17" in core
    for field in ("License-Expression: Apache-2.0", "License-File: LICENSE", "License-File: NOTICE",
                  "Project-URL: Repository, https://github.com/noetl/noetl-dagster", "Classifier: Typing :: Typed",
                  "Author: "):  # fmt: skip
        assert field in meta, field


def test_sdist_holds_tests_docs_and_changelog_and_runs_its_tests(dist, tmp_path):
    with tarfile.open(_sdist(dist)) as tar:
        root = f"noetl_dagster-{VERSION}"
        names = set(tar.getnames())
        for member in ("LICENSE", "NOTICE", "CHANGELOG.md", "README.md", "docs/install.md", "tests/conftest.py",
                       "tests/packaging/test_extras.py", "example_project/playbooks/hello_dagster.yaml"):  # fmt: skip
            assert f"{root}/{member}" in names, member
        assert not [n for n in names if "__pycache__" in n or n.endswith((".pyc", ".db"))]
        tar.extractall(tmp_path, filter="data")
    # a few quick tests from the unpacked sdist, against its own sources (its pyproject's pythonpath)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH",)}
    env["NOETL_DAGSTER_HOME"] = str(tmp_path / "home")
    r = subprocess.run([sys.executable, "-m", "pytest", "-o", "addopts=", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
                        "tests/packaging/test_metadata.py", "tests/packaging/test_extras.py::test_extras_table_matches_pyproject",
                        "tests/dsl/test_unguarded_failure.py", "tests/dsl/test_builder.py"], cwd=tmp_path / root, env=env,
                       capture_output=True, text=True, timeout=600)  # fmt: skip
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    assert re.search(r"^\d+ passed", r.stdout.splitlines()[-1]), r.stdout[-500:]


def _pip(*args: str, env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess:
    """This venv's pip (``--python`` points it at another interpreter)."""
    return subprocess.run([sys.executable, "-m", "pip", *args], capture_output=True, text=True, timeout=900,
                          env=env, cwd=cwd)  # fmt: skip


def _key(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


def core_install(wheel: Path, env_dir: Path, env: dict[str, str]) -> dict[str, str]:
    """A fresh venv with the wheel and what pip resolves for it from the index (no extras); returns
    {name: version} of what pip installed for real (the rest is linked from this venv)."""
    report = env_dir.parent / "resolved.json"
    r = _pip("install", "-q", "--dry-run", "--ignore-installed", "--report", str(report), str(wheel),
             env=env, cwd=env_dir.parent)  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    resolved = {
        _key(i["metadata"]["name"]): i["metadata"]["version"]
        for i in json.loads(report.read_text())["install"]
    }
    assert resolved.pop("noetl-dagster") == VERSION
    venv.create(env_dir, with_pip=False)
    site = env_dir / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"
    here = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    mine = {_key(d.metadata["Name"]): d for d in importlib.metadata.distributions(path=sorted(here))}
    installed: dict[str, str] = {}
    for name, version in resolved.items():
        d = mine.get(name)
        if d is None or d.version != version or not d.files:
            installed[name] = version
            continue
        for f in d.files:  # RECORD: package files, .pyc, the dist-info; scripts (../../bin) are not linked
            if f.parts[0] == "..":
                continue
            target = site / f
            target.parent.mkdir(parents=True, exist_ok=True)
            if not target.exists():
                target.symlink_to(d.locate_file(f))
    py = str(env_dir / "bin" / "python")
    pins = [f"{n}=={v}" for n, v in sorted(installed.items())]
    args = ("--python", py, "install", "-q", "--no-deps", str(wheel), *pins)
    r = _pip(*args, env=env, cwd=env_dir.parent)
    assert r.returncode == 0, r.stderr[-3000:]
    # every requirement of the wheel and of what it pulled in is met, with no extra installed
    check = _pip("--python", py, "check", env=env, cwd=env_dir.parent)
    assert check.returncode == 0, check.stdout + check.stderr
    return installed


def _site(env_dir: Path) -> Path:
    return env_dir / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"


def venv_footprint(env_dir: Path) -> tuple[int, float]:
    """(distributions installed, MB of the venv): files counted at their real size (a file linked
    from this venv counts as if copied), the interpreter's own symlinks in bin/ not at all."""
    dists = list(importlib.metadata.distributions(path=[str(_site(env_dir))]))
    total = 0
    for root, _dirs, files in os.walk(env_dir):
        for f in files:
            path = Path(root, f)
            if path.parent.name == "bin" and f.startswith("python"):
                continue
            total += path.stat().st_size  # follows the link
    return len(dists), total / 1e6


class CoreVenv:
    def __init__(self, root: Path, env: dict[str, str], installed: dict[str, str], seconds: float):
        self.root, self.env, self.installed, self.seconds = root, env, installed, seconds
        self.dir = root / "venv"
        self.bin = self.dir / "bin"

    def cli(self, *args: str, exe: str = "noetl-dagster") -> subprocess.CompletedProcess:
        return subprocess.run([str(self.bin / exe), *args], cwd=self.root, env=self.env, capture_output=True,
                              text=True, timeout=300)  # fmt: skip

    def py(self, code: str) -> subprocess.CompletedProcess:
        return subprocess.run([str(self.bin / "python"), "-c", code], cwd=self.root, env=self.env,
                              capture_output=True, text=True, timeout=300)  # fmt: skip

    def pip(self, *args: str) -> subprocess.CompletedProcess:
        return _pip("--python", str(self.bin / "python"), *args, env=self.env, cwd=self.root)


@pytest.fixture(scope="module")
def core(dist, tmp_path_factory) -> CoreVenv:
    """One fresh venv with the wheel and its core dependencies, shared by the tests below (the last
    one adds analytics-python to it)."""
    root = tmp_path_factory.mktemp("core")
    # no PYTHONPATH for pip either: with the checkout on it, pip saw the editable install's
    # noetl_dagster.egg-info as "already installed" and put only the dependencies in the venv
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    t0 = time.perf_counter()
    installed = core_install(_wheel(dist), root / "venv", env)
    seconds = time.perf_counter() - t0
    env.update(NOETL_DAGSTER_HOME=str(root / "noetl"), DAGSTER_HOME=str(root / "dh"))
    return CoreVenv(root, env, installed, seconds)


def test_core_install_stays_near_dagsters_footprint(core):
    packages, mb = venv_footprint(core.dir)
    # reported with -s (docs/install.md has the full table: benchmarks/bench_install.py)
    print(f"core install: {packages} packages, {mb:.0f} MB, {core.seconds:.0f}s; by pip: {core.installed}")
    assert packages <= CORE_MAX_PACKAGES, packages
    assert mb <= CORE_MAX_MB, mb
    names = {_key(d.metadata["Name"]) for d in importlib.metadata.distributions(path=[str(_site(core.dir))])}
    for heavy in ("duckdb", "polars", "pandas", "pyiceberg", "s3fs", "botocore", "openlineage-python",
                  "psycopg-binary", "numpy", "blake3"):  # fmt: skip
        assert heavy not in names, heavy
    assert {"noetl-dagster", "dagster", "pyarrow", "psycopg"} <= names


def test_core_install_runs_core_playbooks_and_names_missing_extras(core):
    # really the wheel, really without extras
    where = core.py("import noetl_dagster, importlib.util as u; print(noetl_dagster.__file__); "
                    "print([m for m in ('qiskit', 'chdb', 'qdrant_client', 'dagster_k8s', 'example_project', "
                    "'duckdb', 'polars', 'pandas', 'pyiceberg', 's3fs', 'openlineage') if u.find_spec(m)])")  # fmt: skip
    assert where.returncode == 0, where.stderr
    assert str(core.dir) in where.stdout.splitlines()[0] and where.stdout.splitlines()[1] == "[]"

    version = core.cli("--version")
    assert version.returncode == 0 and version.stdout.strip() == f"noetl-dagster, version {VERSION}"

    with _json_server() as port:
        playbook = core.root / "core_kinds.yaml"
        playbook.write_text(CORE_KINDS.replace("PORT", str(port)))
        for runner in ("local", "dagster"):
            for path in (EXAMPLES / "hello_dagster.yaml", playbook):
                out = core.cli("run", "--runner", runner, "--json", str(path))
                assert out.returncode == 0, f"{runner} {path.name}: {out.stderr[-2000:]}"
                summary = json.loads(out.stdout)
                assert summary["status"] == "completed"
                assert "Telemetry" not in out.stderr and "Welcome to Dagster" not in out.stderr
                if path == playbook:
                    assert summary["results"]["total"] == {"total": 6}, summary

    # psycopg without [binary]: the pure-Python build on the system's libpq reaches the real server
    pg = core.py("import psycopg\n"
                 "with psycopg.connect('postgresql://postgres@127.0.0.1:5432/postgres', connect_timeout=10) as c:\n"
                 "    print(psycopg.pq.__impl__, c.execute('select 41 + 1').fetchone()[0])\n")  # fmt: skip
    assert pg.returncode == 0 and pg.stdout.split() == ["python", "42"], pg.stdout + pg.stderr[-2000:]

    # the Dagster integration: Definitions built from a playbook file in the fresh venv, its job resolves
    defs = core.py(
        "from noetl_dagster.translator import build_playbook_definitions\n"
        f"defs = build_playbook_definitions({str(core.root / 'core_kinds.yaml')!r})\n"
        "print(sorted(j.name for j in defs.resolve_all_job_defs() if not j.name.startswith('__')))\n"
    )
    assert defs.returncode == 0, defs.stderr[-2000:]
    assert "core_kinds" in defs.stdout, defs.stdout

    for name, kind, extra in (("quantum_sweep", "quantum", "quantum"), ("orders_duckdb", "duckdb", "duckdb")):
        path = EXAMPLES / f"{name}.yaml"
        line = next(i for i, s in enumerate(path.read_text().splitlines(), 1) if f"kind: {kind}" in s)
        out = core.cli("validate", str(path))
        assert out.returncode == 1
        assert f"{path}:{line}: missing-extra: " in out.stdout + out.stderr
        assert f"tool kind {kind!r} needs: pip install 'noetl-dagster[{extra}]'" in out.stdout + out.stderr
        assert "Traceback" not in out.stdout + out.stderr

    dash = core.cli("dashboard", "--out", str(core.root / "d"))
    assert dash.returncode == 2 and "pip install 'noetl-dagster[analytics]'" in dash.stderr, dash.stderr
    serve = core.cli("serve", "--db", str(core.root / "reg.db"), exe="noetl-registry")
    assert serve.returncode == 2, serve.stderr
    assert serve.stderr.strip() == (
        "error: `noetl-registry serve` needs the 'registry-server' extra: pip install 'noetl-dagster[registry-server]'"
    )


def test_wheel_lives_beside_segments_analytics_python(core, dist):
    """Issue 44: the wheel installed after analytics-python (imported as ``analytics``) overwrote its
    ``analytics/__init__.py``; every package we install is noetl-specific now."""
    r = core.pip("install", "-q", "analytics-python")
    assert r.returncode == 0, r.stderr[-2000:]
    r = core.pip("install", "-q", "--no-deps", "--force-reinstall", str(_wheel(dist)))
    assert r.returncode == 0, r.stderr[-2000:]
    both = core.py(
        "import analytics, noetl_dagster.commands.main, noetl_analytics, noetl_lineage, noetl_registry.cli\n"
        "analytics.write_key = 'k'; analytics.send = False\n"
        "analytics.track('user-1', 'event')\n"  # AttributeError when our package had replaced it
        "print(analytics.__file__)\n"
    )
    assert both.returncode == 0, both.stderr[-2000:]
    assert "/site-packages/analytics/__init__.py" in both.stdout
    # and uninstalling the other library leaves ours whole
    assert core.pip("uninstall", "-y", "-q", "analytics-python").returncode == 0
    ours = core.py("import importlib.resources as r, noetl_analytics, noetl_lineage, noetl_registry.cli\n"
                   "assert r.files('noetl_analytics').joinpath('sql/V001__facts.sql').is_file()\n"
                   "print('ok')")  # fmt: skip
    assert ours.returncode == 0 and ours.stdout.strip() == "ok", ours.stderr[-2000:]
    assert core.pip("check").returncode == 0


# python and http, the core kinds, against a loopback JSON server the test runs
CORE_KINDS = """apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: core_kinds, path: t/core_kinds}
workflow:
  - step: start
    tool:
      - make:
          kind: python
          code: |
            result = {"path": "/items"}
    next:
      arcs:
        - step: fetch
  - step: fetch
    tool:
      - get:
          kind: http
          url: "http://127.0.0.1:PORT{{ start.path }}"
    next:
      arcs:
        - step: total
  - step: total
    tool:
      - sum:
          kind: python
          input: {items: "{{ fetch.data['items'] }}"}
          code: |
            def main(items):
                return {"total": sum(items)}
"""


class _Items(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        body = json.dumps({"items": [1, 2, 3]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


class _json_server:  # noqa: N801 - used as a context manager
    def __enter__(self) -> int:
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), _Items)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self.server.server_address[1]

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
