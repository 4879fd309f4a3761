"""Text embeddings that work offline.

The default embedder, :class:`HashingEmbedder`, needs nothing but numpy: it maps
word unigrams, word bigrams and character n-grams of each text to ``dim``
buckets with a stable hash (blake2b, so every process and machine gives the same
vector), adds them with a hash-chosen sign (which keeps collisions from biasing
dot products), weights counts sublinearly and L2-normalises the result. Texts
that share words or word pieces get a high cosine similarity; there is no
notion of synonyms — for that, plug in a model.

Plugging a model: register a factory under a name and refer to it as
``embedding: {model: <name>, ...}`` in a ``kind: qdrant`` task or call
:func:`get_embedder` yourself::

    from noetl_dagster.tools.qdrant.embeddings import CallableEmbedder, register_embedder

    def minilm(**options):
        import os
        os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never reach the hub at run time
        from sentence_transformers import SentenceTransformer
        model = SentenceTransformer(options["path"])  # a directory on disk / shipped in a package
        return CallableEmbedder("minilm", model.get_sentence_embedding_dimension(),
                                lambda texts: model.encode(list(texts), normalize_embeddings=True))

    register_embedder("minilm", minilm)

Factories can also be published by a package under the ``noetl_dagster.embedders``
entry-point group (``name = "package.module:factory"``).
"""

from __future__ import annotations

import hashlib
import re
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from importlib.metadata import entry_points
from typing import Any, Protocol, runtime_checkable

import numpy as np

DEFAULT_DIM = 384


class EmbeddingError(ValueError):
    """An embedder spec is invalid or names no known embedder."""


@runtime_checkable
class Embedder(Protocol):
    """Turns texts into a ``(len(texts), dim)`` float32 array."""

    name: str
    dim: int

    def embed(self, texts: Sequence[str]) -> np.ndarray: ...

    def spec(self) -> dict[str, Any]:
        """What to store next to the vectors so queries can use the same embedder."""


_WORD_RE = re.compile(r"\w+", re.UNICODE)


@lru_cache(maxsize=1 << 18)
def _bucket(feature: str, dim: int, salt: bytes) -> tuple[int, float]:
    digest = hashlib.blake2b(feature.encode("utf-8"), digest_size=8, key=salt).digest()
    h = int.from_bytes(digest, "little")
    return h % dim, (1.0 if (h >> 63) & 1 else -1.0)


@dataclass
class HashingEmbedder:
    """Deterministic hashing-features embedder (see the module docstring)."""

    dim: int = DEFAULT_DIM
    char_ngrams: tuple[int, int] = (3, 5)
    word_bigrams: bool = True
    salt: str = "noetl"
    name: str = "hashing"
    # Word features carry more meaning than character pieces; the pieces make
    # near-spellings ("index", "indexes") land close together.
    word_weight: float = 1.0
    bigram_weight: float = 0.7
    char_weight: float = 0.35

    def __post_init__(self) -> None:
        if not isinstance(self.dim, int) or isinstance(self.dim, bool) or self.dim < 2:
            raise EmbeddingError(f"hashing embedder: dim must be an integer >= 2, got {self.dim!r}")
        lo, hi = self.char_ngrams
        if not (0 <= lo <= hi):
            raise EmbeddingError(
                f"hashing embedder: char_ngrams must be (min, max) with 0 <= min <= max, got {self.char_ngrams!r}"
            )
        self._salt = hashlib.blake2b(self.salt.encode("utf-8"), digest_size=16).digest()

    def _features(self, text: str) -> dict[str, float]:
        words = _WORD_RE.findall(text.lower())
        feats: dict[str, float] = {}

        def add(key: str, weight: float) -> None:
            feats[key] = feats.get(key, 0.0) + weight

        for w in words:
            add("w:" + w, self.word_weight)
        if self.word_bigrams:
            for a, b in zip(words, words[1:], strict=False):
                add(f"b:{a} {b}", self.bigram_weight)
        lo, hi = self.char_ngrams
        if hi > 0:
            for w in words:
                padded = f"<{w}>"
                for n in range(max(lo, 1), hi + 1):
                    for i in range(len(padded) - n + 1):
                        add("c:" + padded[i : i + n], self.char_weight)
        return feats

    def embed_one(self, text: str) -> np.ndarray:
        if not isinstance(text, str):
            raise EmbeddingError(f"hashing embedder: expected text, got {type(text).__name__}")
        vec = np.zeros(self.dim, dtype=np.float64)
        feats = self._features(text)
        if feats:
            idx = np.empty(len(feats), dtype=np.int64)
            val = np.empty(len(feats), dtype=np.float64)
            for j, (feature, weight) in enumerate(feats.items()):
                bucket, sign = _bucket(feature, self.dim, self._salt)
                idx[j] = bucket
                # sublinear term frequency: repeated words count, but not linearly
                val[j] = sign * (1.0 + np.log(weight)) if weight > 1.0 else sign * weight
            np.add.at(vec, idx, val)
            norm = np.linalg.norm(vec)
            if norm > 0:
                vec /= norm
        return vec.astype(np.float32)

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        if isinstance(texts, str):
            raise EmbeddingError("embed() takes a list of texts; use embed_one() for a single text")
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for i, text in enumerate(texts):
            out[i] = self.embed_one(text)
        return out

    def spec(self) -> dict[str, Any]:
        return {
            "model": self.name,
            "dim": self.dim,
            "char_ngrams": list(self.char_ngrams),
            "word_bigrams": self.word_bigrams,
            "salt": self.salt,
        }


class CallableEmbedder:
    """Wraps any ``texts -> array`` function (a model's ``encode``) as an :class:`Embedder`."""

    def __init__(
        self,
        name: str,
        dim: int,
        fn: Callable[[Sequence[str]], Any],
        options: Mapping[str, Any] | None = None,
    ):
        self.name = name
        self.dim = int(dim)
        self._fn = fn
        self._options = dict(options or {})

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        arr = np.asarray(self._fn(list(texts)), dtype=np.float32)
        if arr.ndim != 2 or arr.shape != (len(texts), self.dim):
            raise EmbeddingError(
                f"embedder {self.name!r} returned shape {arr.shape}, expected ({len(texts)}, {self.dim})"
            )
        return arr

    def spec(self) -> dict[str, Any]:
        return {"model": self.name, "dim": self.dim, **self._options}


EmbedderFactory = Callable[..., Embedder]

_lock = threading.Lock()
_FACTORIES: dict[str, EmbedderFactory] = {"hashing": HashingEmbedder}
_LOADED_ENTRY_POINTS = False
_CACHE: dict[str, Embedder] = {}


def register_embedder(name: str, factory: EmbedderFactory) -> None:
    """Make ``embedding: {model: name, ...}`` build ``factory(**options)``."""
    with _lock:
        _FACTORIES[name] = factory
        for key in [k for k in _CACHE if k.split("\x1f", 1)[0] == name]:
            del _CACHE[key]


def _factories() -> dict[str, EmbedderFactory]:
    global _LOADED_ENTRY_POINTS
    if not _LOADED_ENTRY_POINTS:
        _LOADED_ENTRY_POINTS = True
        for ep in entry_points(group="noetl_dagster.embedders"):
            _FACTORIES.setdefault(ep.name, ep.load())
    return _FACTORIES


def parse_embedding_spec(spec: Any) -> tuple[str, dict[str, Any]]:
    """``None`` | ``"hashing"`` | ``"hashing:384"`` | ``{model: hashing, dim: 384, ...}`` -> (name, options)."""
    if spec is None or spec is True:
        return "hashing", {}
    if isinstance(spec, str):
        name, _, dim = spec.partition(":")
        if not name:
            raise EmbeddingError(f"embedding spec {spec!r} has no model name")
        if dim:
            try:
                return name, {"dim": int(dim)}
            except ValueError:
                raise EmbeddingError(
                    f"embedding spec {spec!r}: the part after ':' must be the dimension"
                ) from None
        return name, {}
    if isinstance(spec, Mapping):
        options = dict(spec)
        name = options.pop("model", options.pop("name", "hashing"))
        if "char_ngrams" in options and isinstance(options["char_ngrams"], list):
            options["char_ngrams"] = tuple(options["char_ngrams"])
        return str(name), options
    raise EmbeddingError(f"embedding spec must be a name or a mapping, got {type(spec).__name__}")


def get_embedder(spec: Any = None) -> Embedder:
    """The embedder a spec names, built once per process per spec."""
    name, options = parse_embedding_spec(spec)
    key = name + "\x1f" + repr(sorted(options.items()))
    with _lock:
        hit = _CACHE.get(key)
        if hit is not None:
            return hit
        factory = _factories().get(name)
    if factory is None:
        raise EmbeddingError(
            f"unknown embedding model {name!r} (known: {', '.join(sorted(_factories()))}); "
            "register one with noetl_dagster.tools.qdrant.embeddings.register_embedder"
        )
    try:
        embedder = factory(**options)
    except TypeError as e:
        raise EmbeddingError(f"embedding model {name!r}: bad options {options}: {e}") from None
    with _lock:
        _CACHE[key] = embedder
    return embedder


def embed_texts(texts: Sequence[str], spec: Any = None) -> np.ndarray:
    return get_embedder(spec).embed(texts)
