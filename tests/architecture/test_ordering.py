"""Under `-n 3 --dist loadfile` the heaviest test files start first (tests/ordering.py): xdist's
own sort by number of tests is off and the collection puts them ahead, heaviest first."""

from __future__ import annotations

from pathlib import Path

from ordering import HEAVY_FILES, heavy_first

REPO = Path(__file__).resolve().parents[2]


def test_every_listed_heavy_file_exists():
    assert [f for f in HEAVY_FILES if not (REPO / f).is_file()] == []


def test_xdist_keeps_the_collection_order(request):
    assert request.config.option.loadscopereorder is False  # else xdist re-sorts files by test count


def test_heavy_files_go_first_by_weight_and_each_file_keeps_its_tests_in_order():
    ids = [
        "tests/a/test_many.py::t1", "tests/a/test_many.py::t2", "tests/a/test_many.py::t3",
        "tests/dsl/test_builder_roundtrip.py::prop", "tests/dsl/test_builder_roundtrip.py::ran",
        "tests/b/test_one.py::t",
        "tests/dagster/test_backfill_dev.py::t",
        "tests/b/test_two.py::t1", "tests/b/test_two.py::t2",
    ]  # fmt: skip
    order = [ids[i] for i in heavy_first(ids)]
    assert order == [
        "tests/dagster/test_backfill_dev.py::t",
        "tests/dsl/test_builder_roundtrip.py::prop", "tests/dsl/test_builder_roundtrip.py::ran",
        "tests/a/test_many.py::t1", "tests/a/test_many.py::t2", "tests/a/test_many.py::t3",
        "tests/b/test_two.py::t1", "tests/b/test_two.py::t2",
        "tests/b/test_one.py::t",
    ]  # fmt: skip


def test_this_session_ran_in_that_order(request):
    files = list(dict.fromkeys(item.nodeid.split("::")[0] for item in request.session.items))
    expected = list(dict.fromkeys(request.session.items[i].nodeid.split("::")[0] for i in
                                  heavy_first([item.nodeid for item in request.session.items])))  # fmt: skip
    assert files == expected
