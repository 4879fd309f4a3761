"""The metadata users and PyPA tools read, checked on the checkout (tests/packaging/test_wheel.py
checks the built sdist and wheel): the version follows the CHANGELOG, the README renders on PyPI
with absolute links, and the license files and the typed-package markers are there (issue 44)."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
CANONICAL = "https://github.com/noetl/noetl-dagster"


def _semver(text: str) -> tuple[int, int, int]:
    major, minor, patch = (int(p) for p in re.fullmatch(r"(\d+)\.(\d+)\.(\d+)", text).groups())
    return major, minor, patch


def test_version_follows_the_changelog():
    """The newest released heading is the version; an [Unreleased] section on top means the next
    release, so the version is above the last one (a breaking change under [Unreleased] bumps the
    minor while 0.x: the version was left at 0.1.0 under breaking changes, issue 44)."""
    headings = re.findall(r"^## \[([^\]]+)\]", (REPO / "CHANGELOG.md").read_text(), re.M)
    version = _semver(PROJECT["version"])
    released = [h for h in headings if h != "Unreleased"]
    if headings[0] == "Unreleased":
        assert version > _semver(released[0]), (PROJECT["version"], released[0])
    else:
        assert version == _semver(headings[0]), (PROJECT["version"], headings[0])


def test_readme_links_and_images_are_absolute():
    """PyPI renders the README without the repository: a relative link or image would break there."""
    text = (REPO / "README.md").read_text()
    targets = re.findall(r"\]\(([^)\s]+)\)", text) + re.findall(r'<img[^>]+src="([^"]+)"', text)
    assert targets
    relative = [t for t in targets if not t.startswith(("https://", "http://", "#", "mailto:"))]
    assert relative == []
    for t in targets:
        if t.startswith(CANONICAL + "/blob/main/"):
            assert (REPO / t.removeprefix(CANONICAL + "/blob/main/").split("#")[0]).exists(), t
        raw = "https://raw.githubusercontent.com/noetl/noetl-dagster/main/"
        if t.startswith(raw):
            assert (REPO / t.removeprefix(raw)).exists(), t


def test_license_notice_py_typed_and_project_metadata():
    assert (
        "Apache License" in (REPO / "LICENSE").read_text() and "Version 2.0" in (REPO / "LICENSE").read_text()
    )
    assert "END OF TERMS AND CONDITIONS" in (REPO / "LICENSE").read_text()  # the full text, not a stub
    assert (REPO / "NOTICE").read_text().startswith("noetl-dagster\n")
    assert PROJECT["license"] == "Apache-2.0" and PROJECT["license-files"] == ["LICENSE", "NOTICE"]
    for folder in (
        "noetl_dagster",
        "analytics/noetl_analytics",
        "lineage/noetl_lineage",
        "registry_service/noetl_registry",
    ):
        assert (REPO / folder / "py.typed").exists(), folder
    assert PROJECT["authors"] and PROJECT["urls"]["Repository"] == CANONICAL
    assert "Typing :: Typed" in PROJECT["classifiers"]
    assert not [c for c in PROJECT["classifiers"] if c.startswith("License ::")]  # PEP 639: the SPDX field
