"""Arrow IPC stream messages written without pyarrow (the local event files, storage/feather_events.py).

A one-step ``run`` must not import pyarrow (~0.2 s; tests/architecture/test_import_set.py), yet
its events are Arrow record batches on disk. This module writes the few message kinds the local
store needs - a Schema, DictionaryBatch and RecordBatch messages of Int8, Int64, Utf8, Binary,
FixedSizeBinary(16), Timestamp(us, UTC) and dictionary-encoded Utf8 (Int32 indices) columns, each
buffer zstd-compressed (Arrow's BodyCompression) - as the Arrow columnar format specifies them
(``format/Message.fbs``, ``Schema.fbs``, encapsulated message framing). Readers use
pyarrow (``read_stream``), which also checks that what is written here is Arrow.

Flatbuffers are laid out front to back: a table's vtable just before it, its children after it,
so every uoffset points forward as the format requires; scalars are aligned to their size.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

CONTINUATION = b"\xff\xff\xff\xff"
METADATA_V5 = 4
HEADER_SCHEMA, HEADER_DICTIONARY_BATCH, HEADER_RECORD_BATCH = 1, 2, 3
TYPE_INT, TYPE_BINARY, TYPE_UTF8, TYPE_TIMESTAMP, TYPE_FIXED_SIZE_BINARY = 2, 4, 5, 10, 15
CODEC_ZSTD = 1
MICROSECOND = 2


@dataclass
class _Table:
    fields: list[tuple[int, str, Any]] = field(default_factory=list)  # (slot, kind, value)


@dataclass
class _Vec:
    tables: list[_Table] | None = None
    structs: bytes = b""
    count: int = 0


_SIZE = {"b": 1, "B": 1, "h": 2, "i": 4, "q": 8}


class _Builder:
    def __init__(self) -> None:
        self.buf = bytearray()

    def pad(self, align: int, rem: int = 0) -> None:
        while len(self.buf) % align != rem:
            self.buf.append(0)

    def patch(self, at: int, target: int) -> None:
        struct.pack_into("<I", self.buf, at, target - at)

    def place(self, obj: Any) -> int:
        if isinstance(obj, _Table):
            return self.table(obj)
        if isinstance(obj, str):
            self.pad(4)
            pos = len(self.buf)
            raw = obj.encode()
            self.buf += struct.pack("<I", len(raw)) + raw + b"\0"
            return pos
        if obj.tables is not None:
            self.pad(4)
            pos = len(self.buf)
            self.buf += struct.pack("<I", len(obj.tables)) + bytes(4 * len(obj.tables))
            for i, t in enumerate(obj.tables):
                self.patch(pos + 4 + 4 * i, self.place(t))
            return pos
        self.pad(8, 4)  # the elements (structs of longs) 8-aligned after the length
        pos = len(self.buf)
        self.buf += struct.pack("<I", obj.count) + obj.structs
        return pos

    def table(self, t: _Table) -> int:
        slots = max((s for s, _k, _v in t.fields), default=-1) + 1
        self.pad(2)
        vt = len(self.buf)
        self.buf += bytes(4 + 2 * slots)
        self.pad(8)
        pos = len(self.buf)
        self.buf += struct.pack("<i", pos - vt)
        offsets: list[int] = [0] * slots
        children: list[tuple[int, Any]] = []
        for slot, kind, value in t.fields:
            size = 4 if kind == "ref" else _SIZE[kind]
            self.pad(size)
            offsets[slot] = len(self.buf) - pos
            if kind == "ref":
                children.append((len(self.buf), value))
                self.buf += bytes(4)
            else:
                self.buf += struct.pack("<" + kind, value)
        struct.pack_into(f"<HH{slots}H", self.buf, vt, 4 + 2 * slots, len(self.buf) - pos, *offsets)
        for at, child in children:
            self.patch(at, self.place(child))
        return pos


def _flatbuffer(root: _Table) -> bytes:
    b = _Builder()
    b.buf += bytes(4)
    b.patch(0, b.table(root))
    return bytes(b.buf)


def _message(header_type: int, header: _Table, body_length: int) -> _Table:
    return _Table([(0, "h", METADATA_V5), (1, "B", header_type), (2, "ref", header), (3, "q", body_length)])


def _frame(meta: bytes, body: bytes = b"") -> bytes:
    meta += bytes(-len(meta) % 8)
    return CONTINUATION + struct.pack("<i", len(meta)) + meta + body


# a column: (name, arrow type, nullable); types "int8", "int64", "utf8", "binary", "timestamp_us_utc",
# "binary16" (FixedSizeBinary(16): no offsets buffer, a null is 16 zero bytes under its validity bit),
# "dict_utf8" (Dictionary<Int32, Utf8>: a record batch holds the indices, DictionaryBatch messages the
# strings; the dictionary ids are the dict_utf8 columns' positions among themselves, 0, 1, ...)
Column = tuple[str, str, bool]


def _type_table(kind: str) -> tuple[int, _Table]:
    if kind == "int64":
        return TYPE_INT, _Table([(0, "i", 64), (1, "B", 1)])
    if kind == "int8":
        return TYPE_INT, _Table([(0, "i", 8), (1, "B", 1)])
    if kind in ("utf8", "dict_utf8"):
        return TYPE_UTF8, _Table()
    if kind == "binary":
        return TYPE_BINARY, _Table()
    if kind == "binary16":
        return TYPE_FIXED_SIZE_BINARY, _Table([(0, "i", 16)])
    if kind == "timestamp_us_utc":
        return TYPE_TIMESTAMP, _Table([(0, "h", MICROSECOND), (1, "ref", "UTC")])
    raise ValueError(f"unsupported column type {kind}")


def dictionary_ids(columns: Sequence[Column]) -> dict[str, int]:
    """The dictionary id of each dict_utf8 column (by name)."""
    return {c[0]: i for i, c in enumerate(c for c in columns if c[1] == "dict_utf8")}


def schema_message(columns: Sequence[Column]) -> bytes:
    fields = []
    ids = dictionary_ids(columns)
    for name, kind, nullable in columns:
        type_id, type_table = _type_table(kind)
        f = _Table([(0, "ref", name), (1, "B", int(nullable)), (2, "B", type_id), (3, "ref", type_table),
                    (5, "ref", _Vec(tables=[]))])  # fmt: skip
        if kind == "dict_utf8":  # DictionaryEncoding: id, indexType Int32 signed
            f.fields.append(
                (4, "ref", _Table([(0, "q", ids[name]), (1, "ref", _Table([(0, "i", 32), (1, "B", 1)]))]))
            )
        fields.append(f)
    schema = _Table([(0, "h", 0), (1, "ref", _Vec(tables=fields))])
    return _frame(_flatbuffer(_message(HEADER_SCHEMA, schema, 0)))


def _validity(values: Sequence[Any]) -> tuple[bytes, int]:
    nulls = sum(v is None for v in values)
    if not nulls:
        return b"", 0
    bits = bytearray((len(values) + 7) // 8)
    for i, v in enumerate(values):
        if v is not None:
            bits[i >> 3] |= 1 << (i & 7)
    return bytes(bits), nulls


def _batch(columns: Sequence[Column], data: Sequence[Sequence[Any]], compressor: Any) -> tuple[_Table, bytes]:
    n = len(data[0]) if data else 0
    nodes, buffers, body = bytearray(), bytearray(), bytearray()

    def add(raw: bytes) -> None:
        if raw and compressor is not None:  # Arrow's buffer compression: the uncompressed length, then zstd
            raw = struct.pack("<q", len(raw)) + compressor.compress(raw)
        buffers.extend(struct.pack("<qq", len(body), len(raw)))
        body.extend(raw + bytes(-len(raw) % 8))

    for (_name, kind, _nullable), values in zip(columns, data, strict=True):
        validity, nulls = _validity(values)
        nodes.extend(struct.pack("<qq", n, nulls))
        add(validity)
        if kind in ("int64", "timestamp_us_utc"):
            add(struct.pack(f"<{n}q", *(v or 0 for v in values)))
            continue
        if kind == "dict_utf8":  # the indices
            add(struct.pack(f"<{n}i", *(v or 0 for v in values)))
            continue
        if kind == "int8":
            add(struct.pack(f"<{n}b", *(v or 0 for v in values)))
            continue
        if kind == "binary16":
            add(b"".join(v if v is not None else bytes(16) for v in values))
            continue
        parts = [(v.encode("utf-8", "surrogatepass") if kind == "utf8" else v) if v is not None else b""
                 for v in values]  # fmt: skip
        offsets, total = [0], 0
        for p in parts:
            total += len(p)
            offsets.append(total)
        add(struct.pack(f"<{n + 1}i", *offsets))
        add(b"".join(parts))
    batch = _Table([(0, "q", n), (1, "ref", _Vec(structs=bytes(nodes), count=len(nodes) // 16)),
                    (2, "ref", _Vec(structs=bytes(buffers), count=len(buffers) // 16))])  # fmt: skip
    if compressor is not None:
        batch.fields.append((3, "ref", _Table([(0, "b", CODEC_ZSTD), (1, "b", 0)])))
    return batch, bytes(body)


def record_batch_message(columns: Sequence[Column], data: Sequence[Sequence[Any]], compressor: Any) -> bytes:
    """One RecordBatch message of ``data`` (one sequence of values per column; None is null; a
    dict_utf8 column's values are indices into its dictionary), its buffers zstd-compressed when a
    ``compressor`` is given."""
    batch, body = _batch(columns, data, compressor)
    return _frame(_flatbuffer(_message(HEADER_RECORD_BATCH, batch, len(body))), body)


def dictionary_batch_message(dict_id: int, values: Sequence[str], delta: bool, compressor: Any) -> bytes:
    """One DictionaryBatch message: ``values`` (Utf8) for dictionary ``dict_id``, appended to the
    dictionary sent so far when ``delta`` (the stream format's delta dictionaries), else the first."""
    batch, body = _batch([("values", "utf8", False)], [list(values)], compressor)
    header = _Table([(0, "q", dict_id), (1, "ref", batch), (2, "B", int(delta))])
    return _frame(_flatbuffer(_message(HEADER_DICTIONARY_BATCH, header, len(body))), body)


def read_stream(raw: bytes) -> tuple[list[Any], int]:
    """The record batches of an IPC stream (pyarrow, imported here) and the byte length of its
    complete prefix: the stream up to its last whole record batch. A message cut by a kill -9
    mid-write ends the stream there (and so do dictionary batches after the last record batch: the
    batch they were written for never arrived); so does a batch pyarrow cannot read."""
    import pyarrow as pa  # noqa: PLC0415 - readers only; a run writes without it

    buf = pa.py_buffer(raw)
    reader = pa.BufferReader(buf)
    ends: list[int] = []  # where the schema and each record batch end
    while True:
        try:
            msg = pa.ipc.read_message(reader)
        except (pa.ArrowInvalid, OSError, EOFError, StopIteration):
            break
        if msg is None:
            break
        if not ends and msg.type != "schema":
            break
        if msg.type in ("schema", "record batch"):
            ends.append(reader.tell())
    if not ends:
        return [], 0
    batches: list[Any] = []
    try:
        stream = pa.ipc.open_stream(buf.slice(0, ends[-1]))
        while len(batches) < len(ends) - 1:
            batches.append(stream.read_next_batch())
    except (pa.ArrowInvalid, OSError, EOFError, StopIteration, KeyError):
        pass
    return batches, ends[len(batches)]
