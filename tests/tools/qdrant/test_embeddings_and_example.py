"""The offline embedder and the example playbook that indexes documents and answers a question."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from noetl_dagster.runners.local import run_playbook
from noetl_dagster.tools.qdrant.embeddings import (
    CallableEmbedder,
    EmbeddingError,
    HashingEmbedder,
    get_embedder,
    parse_embedding_spec,
    register_embedder,
)

EXAMPLE = Path(__file__).resolve().parents[3] / "example_project" / "playbooks" / "vector_search.yaml"


def test_hashing_vectors_are_unit_length_and_deterministic_across_processes():
    emb = HashingEmbedder(dim=16)
    vec = emb.embed_one("Vector indexes on Qdrant")
    assert vec.dtype == np.float32 and vec.shape == (16,)
    assert np.linalg.norm(vec) == pytest.approx(1.0, abs=1e-6)
    # another interpreter with another hash seed gives the same numbers (blake2b, not hash())
    code = "from noetl_dagster.tools.qdrant.embeddings import HashingEmbedder; print(HashingEmbedder(dim=16).embed_one('Vector indexes on Qdrant').tolist())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={"PYTHONHASHSEED": "12345", "PATH": ""}).stdout  # fmt: skip
    np.testing.assert_array_equal(np.array(eval(out), dtype=np.float32), vec)  # noqa: S307 - our own output


def test_shared_words_make_texts_close():
    emb = get_embedder({"model": "hashing", "dim": 256})
    a, b, c = emb.embed(
        ["qdrant stores vectors in collections", "collections of vectors in qdrant", "the cat sat on a mat"]
    )
    assert float(a @ b) > 0.5 > float(a @ c) + 0.3
    assert emb.embed([""]).tolist() == [[0.0] * 256]  # nothing to hash: the zero vector, not NaN


def test_specs_and_errors():
    assert parse_embedding_spec("hashing:64") == ("hashing", {"dim": 64})
    assert parse_embedding_spec(None) == ("hashing", {})
    assert get_embedder("hashing:64") is get_embedder({"model": "hashing", "dim": 64})  # built once
    assert get_embedder("hashing:64").spec()["dim"] == 64
    with pytest.raises(EmbeddingError, match="unknown embedding model 'nope'"):
        get_embedder("nope")
    with pytest.raises(EmbeddingError, match="dim must be an integer"):
        HashingEmbedder(dim=1)
    with pytest.raises(EmbeddingError, match="after ':' must be the dimension"):
        parse_embedding_spec("hashing:big")


def test_a_plugged_model_is_used_by_name(run):
    # stands in for a real model: any texts -> array function plugs in the same way
    register_embedder(
        "lengths", lambda dim=2: CallableEmbedder("lengths", dim, lambda ts: [[len(t), 1.0] for t in ts])
    )
    assert get_embedder("lengths").embed(["abc"]).tolist() == [[3.0, 1.0]]
    bad = CallableEmbedder("bad", 3, lambda ts: [[1.0, 2.0] for _ in ts])
    with pytest.raises(EmbeddingError, match=r"returned shape \(1, 2\), expected \(1, 3\)"):
        bad.embed(["x"])
    r = run([
        {"step": "load", "tool": {"kind": "qdrant", "operation": "upsert", "collection": "plug", "create_if_missing": True,
                                  "distance": "euclid", "embedding": "lengths",
                                  "points": [{"id": 1, "text": "ab"}, {"id": 2, "text": "abcdefgh"}]}},
        {"step": "ask", "tool": {"kind": "qdrant", "collection": "plug", "embedding": "lengths", "text": "abcdefg", "limit": 1}},
    ])  # fmt: skip
    assert r.status == "completed", r.result.to_json()
    assert r.results["ask"]["hits"][0]["id"] == 2


def test_example_playbook_answers_offline(home):
    result = run_playbook(EXAMPLE, data_dir=home)
    assert result.status == "completed", result.to_json()
    answer = result.results["answer"]
    assert answer["source"] == "doc-qdrant-local"
    assert "one client may open a local storage path" in answer["answer"]
    assert len(answer["hits"]) == 3
    assert result.results["index_docs"]["points_count"] == 8

    # a second run in the same process reuses the shared client; the filter narrows to one topic
    result = run_playbook(
        EXAMPLE, {"question": "Which store writes each event id once?", "topic": "storage"}, data_dir=home
    )
    assert result.status == "completed", result.to_json()
    answer = result.results["answer"]
    assert answer["source"] == "doc-postgres"
    assert {h["id"] for h in answer["hits"]} <= {"doc-postgres", "doc-parquet"}


def test_example_playbook_on_the_dagster_runner_matches_the_local_runner(home):
    from noetl_dagster.translator.runner import run_playbook_dagster

    local = run_playbook(EXAMPLE, data_dir=home)
    on_dagster = run_playbook_dagster(EXAMPLE, data_dir=home)
    assert on_dagster.status == "completed", on_dagster.to_json()
    assert on_dagster.results["answer"] == local.results["answer"]
