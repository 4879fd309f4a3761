"""The local mode's event store (seed 004 H.11, issue 46): one local execution's events and commands
buffered in memory and written as Arrow record batches under ``<local root>/<execution_id>/``::

    events.feather    Arrow IPC stream: the schema, then one record batch per flush (EVENT_COLUMNS)
    commands.feather  the same for the step runs the runner dispatched (COMMAND_COLUMNS)
    metadata.json     execution_id, playbook, status, started_at, finished_at, events, pushed_to
    lease             flock'd by the process that runs or resumes the execution

A flush appends one batch with one ``write`` (docs/events.md "Local mode"): at ``flush_bytes``
(4 MiB) of buffered bodies, after ``idle_seconds`` (30 s) without one, at ``close`` (exit) and at
each ``barrier`` - the engine calls it before a task with an outside effect, so a kill -9 never
loses an event recorded before a side effect. Flushes at the seed's points are fsync'd; a barrier
is fsync'd only when durable (``--durable``, or ``barrier(durable=True)``). A batch cut by a kill is
dropped when the file is read (and cut off before the next append): the execution is what its
last complete batch says, which ``resume`` continues.

Sequences, idempotency on ``event_id`` and the hash chain (engine/chain.py) are kept as the SQLite
store keeps them, so ``push`` (storage/local_mode.py) hands a stored store the same events."""

from __future__ import annotations

import atexit
import calendar
import contextlib
import fcntl
import hashlib
import json
import os
import re
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from noetl_dagster.engine import recorder as _recorder
from noetl_dagster.engine.chain import GENESIS, event_link
from noetl_dagster.engine.events import Event
from noetl_dagster.engine.ports import EventStore, ExecutionInfo, ExecutionLeased, StoredEvent
from noetl_dagster.engine.recorder import check_event_size
from noetl_dagster.storage.arrow_ipc import (
    Column,
    dictionary_batch_message,
    dictionary_ids,
    read_stream,
    record_batch_message,
    schema_message,
)
from noetl_dagster.util.jsonutil import dumps_bytes, loads

EVENTS_FILE, COMMANDS_FILE, METADATA_FILE, LEASE_FILE = (
    "events.feather", "commands.feather", "metadata.json", "lease")  # fmt: skip
FLUSH_BYTES = int(os.environ.get("NOETL_LOCAL_FLUSH_BYTES") or 4 * 1024 * 1024)
IDLE_SECONDS = float(os.environ.get("NOETL_LOCAL_IDLE_SECONDS") or 30)

# The layout since issue 46's footprint work ("v3"; docs/events.md "Local mode"): the repeated text
# columns dictionary-encoded, event ids the store named itself left out (derived on read), the
# event's own ids out of its body. Files of the earlier layouts (V2_EVENT_COLUMNS, and utf8 event
# ids before it) are read as before; a resume cannot append to them (the schema differs).
EVENT_COLUMNS: list[Column] = [
    ("sequence", "int64", False),
    # a uuid's 16 bytes (text is 36 bytes and an offset); null: event_id_text, or when both are null
    # the id the store gave the event, derived_event_id(execution, first event's id, sequence, created_at)
    ("event_id", "binary16", True),
    ("event_id_text", "utf8", True),  # an id that is not lowercase uuid text, as given
    ("execution_id", "dict_utf8", False),
    ("event_type", "dict_utf8", False),
    ("step", "dict_utf8", True),
    ("status", "dict_utf8", False),
    ("created_at", "timestamp_us_utc", False),
    ("step_run_id", "dict_utf8", True),
    ("loop_id", "dict_utf8", True),
    ("task_run_id", "binary16", True),  # a uuid task_run_id's bytes (any other stays in the body)
    ("packing", "int8", False),  # PACK_* below: where the body's entity_id went, ids replaced in it
    # the rest of the event: Event.to_stored(envelope=False) as JSON, without what the columns above hold
    ("body", "binary", False),
    ("hash", "binary", False),  # the chain hash (engine/chain.py): empty, in full on a batch's last
]
V2_EVENT_COLUMNS: list[Column] = [  # the layout before (the body held every field but the envelope)
    ("sequence", "int64", False),
    ("event_id", "binary16", True),
    ("event_id_text", "utf8", True),
    ("execution_id", "utf8", False),
    ("event_type", "utf8", False),
    ("step", "utf8", True),
    ("status", "utf8", False),
    ("created_at", "timestamp_us_utc", False),
    ("body", "binary", False),
    ("hash", "binary", False),
]
_DICT_IDS = dictionary_ids(EVENT_COLUMNS)
# packing: the low 3 bits say the entity_id is the event's task_run_id (1), step_run_id (2), loop_id
# (3) or execution_id (4), 0: in the body as it was (or none); PACK_IDS: the body's occurrences of
# those ids' text are replaced by one control byte each (_MARKS: JSON text never holds them raw)
PACK_ENTITY, PACK_IDS = 7, 8
_MARKS = (b"\x01", b"\x02", b"\x03", b"\x04")  # task_run_id, step_run_id, loop_id, execution_id
_MARK_RE = re.compile(b"[\x01-\x04]")
COMMAND_COLUMNS: list[Column] = [
    ("command_id", "utf8", False),  # the event_id of the step.scheduled event that dispatched it
    ("execution_id", "utf8", False),
    ("sequence", "int64", False),
    ("step", "utf8", True),
    ("step_run_id", "utf8", True),
    ("created_at", "timestamp_us_utc", False),
]
COMMAND_EVENTS = frozenset({"step.scheduled"})
COMPRESS_MIN = 64 * 1024  # buffered body bytes from which a batch's buffers are zstd-compressed
# zstd level 6: a 1,000-iteration loop's batch 11% smaller than at 3 for ~1 us more an event (issue 46)
ZSTD_LEVEL = 6
# the chain hash is kept in full on each batch's last event only (an empty one on the others):
# engine.chain.check_chain recomputes the chain and checks the batch's events at its last hash.
# A per-event mark was 8 random bytes an event that compression cannot shrink (issue 46 footprint).
_SCHEMAS: dict[str, bytes] = {}


def _schema(name: str, columns: list[Column]) -> bytes:
    if name not in _SCHEMAS:
        _SCHEMAS[name] = schema_message(columns)
    return _SCHEMAS[name]


# the last second's text and value, replaced whole (a thread never pairs one's text with another's value)
# the last second's text and value, replaced whole (no thread pairs one's text with another's value)
_second: tuple[str, int] = ("", 0)


def micros(ts: str) -> int | None:
    """Microseconds since the epoch of a recorder timestamp (``YYYY-MM-DDTHH:MM:SS.ffffff+00:00``)
    that ``iso`` gives back exactly, or None for any other text (the body then keeps it: see _pack).
    Sliced, not parsed: datetime costs a run 4 ms to import."""
    if len(ts) != 32 or ts[19] != "." or not ts.endswith("+00:00"):
        return None
    frac = ts[20:26]
    if not (frac.isascii() and frac.isdigit()):
        return None
    global _second
    head = ts[:19]
    cached = _second
    if head != cached[0]:
        try:
            sec = calendar.timegm((int(ts[0:4]), int(ts[5:7]), int(ts[8:10]), int(ts[11:13]), int(ts[14:16]),
                                   int(ts[17:19]), 0, 0, 0))  # fmt: skip
        except (TypeError, ValueError, OverflowError):
            return None
        if time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(sec)) != head:  # e.g. month 13: not given back
            return None
        cached = _second = (head, sec)
    return cached[1] * 1_000_000 + int(frac)


def uuid_bytes(text: str) -> bytes | None:
    """The 16 bytes of lowercase uuid text (``8-4-4-4-12`` hex digits), None for any other id (kept
    as text: the column must give the id back exactly)."""
    if len(text) != 36:
        return None
    try:
        raw = bytes.fromhex(text[:8] + text[9:13] + text[14:18] + text[19:23] + text[24:])
    except ValueError:
        return None
    return raw if uuid_text(raw) == text else None


def uuid_text(raw: bytes) -> str:
    h = raw.hex()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def derived_event_id(execution_id: str, anchor: str, sequence: int, us: int) -> str:
    """The id the local store gives an event it numbers (one created without an id, unseen outside
    this process: ``Event.fresh``): a uuid with the v7 layout - the event's millisecond (B-tree
    order kept where it is pushed), then 74 bits of sha256 over the execution, its first event's id
    (``anchor``: random, so ids cannot be guessed from an execution id alone) and the sequence. Unique
    where (execution, sequence) is; anyone holding the log can recompute it, so the file keeps nothing
    for it, and the chain hash covers the id read back (an edited sequence or time breaks it)."""
    d = hashlib.sha256(
        f"noetl-event-id\0{execution_id}\0{anchor}\0{sequence}".encode("utf-8", "surrogatepass")
    ).digest()
    # 48 bits of milliseconds, version 7 and 12 bits (rand_a), variant 0b10 and 62 bits (rand_b)
    head = ((us // 1000) & 0xFFFFFFFFFFFF).to_bytes(6, "big")
    return uuid_text(head + bytes((0x70 | (d[0] & 0x0F), d[1], 0x80 | (d[2] & 0x3F))) + d[3:10])


def iso(us: int) -> str:
    """The recorder's timestamp text of ``us`` (engine/events._iso_at)."""
    sec, frac = divmod(us, 1_000_000)
    return f"{time.strftime('%Y-%m-%dT%H:%M:%S', time.gmtime(sec))}.{frac:06d}+00:00"


# a buffered event: (event, packed body, hash, created_at in us or None, task_run_id bytes or None,
# packing, whether the store named it)
_Row = tuple[Event, bytes, bytes, "int | None", "bytes | None", int, bool]


@dataclass
class _Local:
    """One execution's files and what is buffered for them."""

    dir: Path
    last: int = 0
    head: bytes = GENESIS
    anchor: str | None = None  # the first event's id (derived_event_id)
    ids: dict[str, int] = field(default_factory=dict)
    pending: list[_Row] = field(default_factory=list)
    # each dictionary column's values (index order) and how many of them the file has
    dicts: dict[str, dict[str, int]] = field(default_factory=lambda: {k: {} for k in _DICT_IDS})
    dict_sent: dict[str, int] = field(default_factory=lambda: dict.fromkeys(_DICT_IDS, 0))
    batches: int = 0  # record batches in events.feather (the first one carries whole dictionaries)
    pending_bytes: int = 0
    meta: dict[str, Any] = field(default_factory=dict)
    fds: dict[str, int] = field(default_factory=dict)
    events_ok: int = 0  # bytes of events.feather known complete (the rest is cut before appending)
    commands_ok: int = 0


class FeatherEventStore(EventStore):
    """The local mode's EventStore: every execution a folder under ``root``."""

    def __init__(self, root: str | os.PathLike[str], *, durable: bool = False, flush_bytes: int = FLUSH_BYTES,
                 idle_seconds: float = IDLE_SECONDS):  # fmt: skip
        self.root = Path(root)
        self.url = f"local://{self.root}"
        self.durable = durable
        self.flush_bytes = flush_bytes
        self.idle_seconds = idle_seconds
        self._lock = threading.RLock()
        self._execs: dict[str, _Local] = {}
        self.written: set[str] = set()  # executions this store appended to (``run`` pushes them)
        self._leases: dict[str, int] = {}
        self._compressor: Any = None
        self._last_flush = time.monotonic()
        self._idle: threading.Thread | None = None
        self._closed = threading.Event()
        # the engine calls barrier before side effects (engine/recorder.py); until a first barrier the
        # store cannot tell a caller that does from one that never will, so it writes each append through
        self._barriers = False
        self.skipped: list[tuple[str, str]] = []
        atexit.register(self.close)  # a run that ends without close still flushes (exit is a flush point)

    # -- writing ---------------------------------------------------------------------------------

    def append(self, events: Sequence[Event]) -> list[Event]:
        if not events:
            return []
        with self._lock:
            touched: set[str] = set()
            for ev in events:
                x = self._open(ev.execution_id)
                seq = x.ids.get(ev.event_id)
                if seq is not None:  # re-sent: keeps its stored sequence
                    ev.sequence = seq
                    continue
                seq = ev.sequence = x.last + 1
                us = micros(ev.timestamp)  # None: a timestamp the column cannot give back (the body keeps it)
                named = False
                if seq == 1:
                    x.anchor = ev.event_id
                elif ev.fresh and us is not None and x.anchor is not None:
                    ev.event_id = derived_event_id(ev.execution_id, x.anchor, seq, us)
                    named = True
                ev.made_id = None  # its id is fixed now: a re-send, a push carry this one
                body, traw, packing = _pack(ev, us)
                x.head = event_link(x.head, seq, ev)
                x.last = seq
                x.ids[ev.event_id] = seq
                x.pending.append((ev, body, x.head, us, traw, packing, named))
                x.pending_bytes += len(body)
                self._note(x, ev)
                touched.add(ev.execution_id)
            self.written |= touched
            for eid in touched:
                x = self._execs[eid]
                if x.pending_bytes >= self.flush_bytes:
                    self._flush(x, fsync=True)
                elif not self._barriers:  # a caller that never calls barrier: every append written through
                    self._flush(x, fsync=self.durable)
            if self._idle is None and self.idle_seconds > 0:
                self._idle = threading.Thread(
                    target=self._idle_flusher, name="noetl-local-flush", daemon=True
                )
                self._idle.start()
        return list(events)

    buffers_appends = True  # the engine hands over every step's events; barrier() writes them through

    def barrier(self, durable: bool = True) -> None:
        """Write every buffered event through to the OS (a kill -9 after this loses none of them);
        fsync too when ``durable`` or the store is (``--durable``)."""
        with self._lock:
            self._barriers = True
            for x in self._execs.values():
                self._flush(x, fsync=durable or self.durable)

    def flush(self, fsync: bool = True) -> None:
        with self._lock:
            for x in self._execs.values():
                self._flush(x, fsync=fsync)

    def _note(self, x: _Local, ev: Event) -> None:
        m = x.meta
        m.setdefault("execution_id", ev.execution_id)
        m.setdefault("started_at", ev.timestamp)
        if ev.parent_execution_id:
            m.setdefault("parent_execution_id", ev.parent_execution_id)
        if ev.name == "playbook.execution.requested":
            m["playbook"] = ev.data.get("playbook")
            m["playbook_path"] = ev.data.get("file")
            m["status"] = "requested"
        elif ev.name == "workflow.started":
            m["status"] = "running"
        elif ev.name == "workflow.finished":
            m["status"], m["finished_at"] = ev.data.get("status", "completed"), ev.timestamp
        m["events"] = ev.sequence

    def _flush(self, x: _Local, fsync: bool) -> None:
        if not x.pending:
            if fsync and x.fds:
                for fd in x.fds.values():
                    os.fsync(fd)
            return
        compress = (
            x.pending_bytes >= COMPRESS_MIN
        )  # a small batch gains little and zstd costs 19 ms to import
        if compress and self._compressor is None:
            import zstandard  # noqa: PLC0415 - at the first big flush

            self._compressor = zstandard.ZstdCompressor(level=ZSTD_LEVEL)
        rows, x.pending, x.pending_bytes = x.pending, [], 0
        cols, cmds = _columns(x, rows)
        zstd = self._compressor if compress else None
        # the dictionaries' new values go just before the batch (whole ones before the file's first)
        msg = bytearray()
        for name, dict_id in _DICT_IDS.items():
            values, sent = x.dicts[name], x.dict_sent[name]
            if len(values) > sent or not x.batches:
                msg += dictionary_batch_message(dict_id, list(values)[sent:], x.batches > 0, zstd)
        msg += record_batch_message(EVENT_COLUMNS, cols, zstd)
        try:
            x.events_ok = self._write(x, EVENTS_FILE, EVENT_COLUMNS, msg, fsync)
            x.batches += 1
            for name in _DICT_IDS:
                x.dict_sent[name] = len(x.dicts[name])
            if cmds[0]:
                x.commands_ok = self._write(x, COMMANDS_FILE, COMMAND_COLUMNS,
                                            record_batch_message(COMMAND_COLUMNS, cmds, zstd), fsync)  # fmt: skip
        except BaseException:  # a full disk: the files end at their last whole batch, the rows stay buffered
            for name, ok in ((EVENTS_FILE, x.events_ok), (COMMANDS_FILE, x.commands_ok)):
                fd = x.fds.pop(name, None)
                if fd is not None:
                    with contextlib.suppress(OSError):
                        os.ftruncate(fd, ok)
                    os.close(fd)
            for name, values in x.dicts.items():  # the values the file did not get are given again
                sent = x.dict_sent[name]
                if len(values) > sent:
                    x.dicts[name] = dict(list(values.items())[:sent])
            x.pending, x.pending_bytes = rows + x.pending, x.pending_bytes + sum(len(r[1]) for r in rows)
            raise
        self._write_meta(x, fsync)
        self._last_flush = time.monotonic()

    def _write(self, x: _Local, name: str, columns: list[Column], msg: bytes | bytearray, fsync: bool) -> int:
        """Append one batch's messages; returns the file's length after them."""
        fd = x.fds.get(name)
        if fd is None:
            fd = x.fds[name] = os.open(x.dir / name, os.O_RDWR | os.O_CREAT, 0o644)
            ok = x.events_ok if name == EVENTS_FILE else x.commands_ok
            schema = _schema(name, columns)
            if ok and os.pread(fd, len(schema), 0) != schema:  # batches of another layout cannot follow
                os.close(fd)
                del x.fds[name]
                raise ValueError(f"{x.dir / name} was written with an earlier column layout: push it "
                                 "(noetl-dagster push) or run the playbook again; it cannot be appended to")  # fmt: skip
            os.ftruncate(fd, ok)  # a batch a kill cut short is not continued
            os.lseek(fd, ok, os.SEEK_SET)
            if ok == 0:
                os.write(fd, schema)
        view = memoryview(msg)
        while view:  # one batch, written whole (a short write continues)
            view = view[os.write(fd, view) :]
        if fsync:
            os.fsync(fd)
        return os.lseek(fd, 0, os.SEEK_CUR)

    def _write_meta(self, x: _Local, fsync: bool) -> None:
        tmp = x.dir / (METADATA_FILE + ".tmp")
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(x.meta, f, sort_keys=True)
            if fsync:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, x.dir / METADATA_FILE)

    def _idle_flusher(self) -> None:
        while not self._closed.wait(min(self.idle_seconds, 5.0)):
            if time.monotonic() - self._last_flush >= self.idle_seconds:
                with self._lock:
                    if self._closed.is_set():
                        return
                    for x in self._execs.values():
                        self._flush(x, fsync=True)
                    self._last_flush = time.monotonic()

    def _open(self, execution_id: str) -> _Local:
        """The execution's writer state: new, or continued from its files (resume in a new process)."""
        x = self._execs.get(execution_id)
        if x is not None:
            return x
        d = self.root / _safe(execution_id)
        d.mkdir(parents=True, exist_ok=True)
        x = _Local(d)
        if (d / EVENTS_FILE).exists():
            loaded = self._load(execution_id)
            for seq, ev, h in loaded.entries:
                if ev is not None:
                    x.ids[ev.event_id] = seq
                x.last, x.head = seq, h or x.head
            x.events_ok, x.commands_ok, x.meta = loaded.events_ok, loaded.commands_ok, loaded.meta
            x.anchor, x.batches = loaded.anchor, loaded.batches
            for name, values in loaded.dicts.items():
                x.dicts[name] = {v: i for i, v in enumerate(values)}
                x.dict_sent[name] = len(values)
        self._execs[execution_id] = x
        return x

    # -- reading ---------------------------------------------------------------------------------

    def _load(self, execution_id: str) -> _Loaded:
        d = self.root / _safe(execution_id)
        out = _Loaded()
        try:
            raw = (d / EVENTS_FILE).read_bytes()
        except FileNotFoundError:
            return out
        batches, out.events_ok = read_stream(raw)
        with contextlib.suppress(FileNotFoundError):
            out.commands_ok = read_stream((d / COMMANDS_FILE).read_bytes())[1]
        with contextlib.suppress(FileNotFoundError, ValueError):
            out.meta = json.loads((d / METADATA_FILE).read_text(encoding="utf-8"))
        out.batches = len(batches)
        anchor: str | None = None
        for b in batches:
            n = b.num_rows
            c = b.to_pydict()
            c["created_at"] = b.column("created_at").cast("int64").to_pylist()  # us: no datetime objects
            texts = c.get("event_id_text") or [None] * n  # files written before it: utf8 event_id
            packed = "packing" in c  # the v3 layout (EVENT_COLUMNS); earlier ones keep all in the body
            nones = [None] * n
            for seq, raw_id, text_id, eid, name, us, body, h, step, status, srid, loop, traw, packing in zip(
                c["sequence"], c["event_id"], texts, c["execution_id"], c["event_type"], c["created_at"],
                c["body"], c["hash"], c["step"], c["status"], c.get("step_run_id", nones),
                c.get("loop_id", nones), c.get("task_run_id", nones), c.get("packing", nones), strict=True,
            ):  # fmt: skip
                if raw_id is not None:
                    event_id = raw_id if isinstance(raw_id, str) else uuid_text(raw_id)
                elif text_id is not None:
                    event_id = text_id
                else:  # named by the store (derived_event_id): no anchor, no id (the row is reported)
                    event_id = (
                        derived_event_id(eid, anchor, seq, us) if anchor is not None and seq != 1 else None
                    )
                if seq == 1:
                    anchor = event_id
                ev = _decode(self.skipped, seq, event_id, eid, name, us, body, (step, status, srid, loop, traw, packing)
                                  if packed else None)  # fmt: skip
                out.entries.append((seq, ev, h))
        out.anchor = anchor
        if batches:
            last = batches[-1]
            for name in _DICT_IDS:
                col = last.column(name) if name in last.schema.names else None
                out.dicts[name] = (
                    col.dictionary.to_pylist() if col is not None and hasattr(col, "dictionary") else []
                )
        return out

    def _entries(self, execution_id: str) -> list[tuple[int, Event | None, bytes | None]]:
        with self._lock:
            x = self._execs.get(execution_id)
            pending = [(p[0].sequence or 0, p[0], p[2]) for p in x.pending] if x else []
            if x is not None and not x.fds and not (x.dir / EVENTS_FILE).exists():
                return list(pending)
        on_disk = self._load(execution_id).entries
        seen = {s for s, _e, _h in on_disk}
        return on_disk + [p for p in pending if p[0] not in seen]

    def has(self, execution_id: str) -> bool:
        return execution_id in self._execs or (self.root / _safe(execution_id) / EVENTS_FILE).exists()

    def read(self, execution_id: str, after_sequence: int = 0) -> list[Event]:
        return [e for s, e, _h in self._entries(execution_id) if e is not None and s > after_sequence]

    def read_chained(self, execution_id: str) -> list[tuple[int, Event | None, bytes | None]]:
        return self._entries(execution_id)

    def metadata(self, execution_id: str) -> dict[str, Any]:
        with self._lock:
            x = self._execs.get(execution_id)
            if x is not None:
                return dict(x.meta)
        try:
            return json.loads((self.root / _safe(execution_id) / METADATA_FILE).read_text(encoding="utf-8"))
        except (FileNotFoundError, ValueError):
            return {}

    def mark_pushed(self, execution_id: str, url: str, last: int) -> None:
        """Record in metadata.json that the execution up to ``last`` is in the store at ``url``."""
        with self._lock:
            x = self._open(execution_id)
            x.meta["pushed_to"], x.meta["pushed_sequence"] = url, last
            self._write_meta(x, fsync=True)

    def execution_ids(self) -> list[str]:
        try:
            return sorted((p.name for p in self.root.iterdir() if (p / EVENTS_FILE).exists()), reverse=True)
        except FileNotFoundError:
            return []

    def executions(self, limit: int = 100) -> list[ExecutionInfo]:
        out = []
        for eid in {*self.execution_ids(), *self._execs}:
            m = self.metadata(eid)
            out.append(ExecutionInfo(eid, m.get("playbook"), m.get("status") or "unknown", m.get("started_at"),
                                     m.get("finished_at"), m.get("parent_execution_id"), int(m.get("events") or 0)))  # fmt: skip
        out.sort(key=lambda i: i.started_at or "", reverse=True)
        return out[:limit]

    def tail(self, after_gid: int = 0, limit: int = 1000) -> list[StoredEvent]:
        """Local executions have no global cursor: sensors and exporters see one once pushed."""
        return []

    def tail_last(self) -> int:
        return 0

    # -- leases: an flock on <execution>/lease, released by the kernel when its process dies -------

    def acquire_lease(self, execution_id: str) -> None:
        if execution_id in self._leases:
            return
        d = self.root / _safe(execution_id)
        d.mkdir(parents=True, exist_ok=True)
        fd = os.open(d / LEASE_FILE, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise ExecutionLeased(f"execution {execution_id} is running in another process (its local "
                                  f"folder {d} is locked)") from None  # fmt: skip
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._leases[execution_id] = fd

    def release_lease(self, execution_id: str) -> None:
        fd = self._leases.pop(execution_id, None)
        if fd is not None:
            os.close(fd)  # closing the descriptor drops the flock

    def close(self) -> None:
        with self._lock:
            if self._closed.is_set():
                return
            self._closed.set()
            for x in self._execs.values():
                self._flush(x, fsync=True)
                for fd in x.fds.values():
                    os.close(fd)
                x.fds.clear()
            self._execs.clear()
        for eid in list(self._leases):
            self.release_lease(eid)
        atexit.unregister(self.close)


@dataclass
class _Loaded:
    entries: list[tuple[int, Event | None, bytes | None]] = field(default_factory=list)
    events_ok: int = 0
    commands_ok: int = 0
    meta: dict[str, Any] = field(default_factory=dict)
    anchor: str | None = None
    batches: int = 0
    dicts: dict[str, list[str]] = field(default_factory=dict)


def _columns(x: _Local, rows: list[_Row]) -> tuple[list[list[Any]], list[list[Any]]]:
    """The events.feather and commands.feather columns of ``rows`` (new dictionary values added to
    ``x.dicts``; the caller sends them before the batch)."""
    cols: list[list[Any]] = [[] for _ in EVENT_COLUMNS]
    cmds: list[list[Any]] = [[] for _ in COMMAND_COLUMNS]
    (c_seq, c_id, c_text, c_exec, c_type, c_step, c_status, c_at, c_srid, c_loop, c_trid, c_pack, c_body,
     c_hash) = cols  # fmt: skip
    d_exec, d_type, d_step, d_status, d_srid, d_loop = (x.dicts[k] for k in (
        "execution_id", "event_type", "step", "status", "step_run_id", "loop_id"))  # fmt: skip
    last = len(rows) - 1
    for n, (ev, body, h, us, traw, packing, named) in enumerate(rows):
        eid = ev.event_id
        if named:  # the store named it (derived_event_id): nothing to keep
            raw_id, text_id = None, None
        else:
            raw_id = uuid_bytes(eid)
            text_id = None if raw_id else eid
        c_seq.append(ev.sequence)
        c_id.append(raw_id)
        c_text.append(text_id)
        c_exec.append(d_exec.setdefault(ev.execution_id, len(d_exec)))
        c_type.append(d_type.setdefault(ev.name, len(d_type)))
        c_step.append(None if ev.step is None else d_step.setdefault(ev.step, len(d_step)))
        c_status.append(d_status.setdefault(ev.status, len(d_status)))
        c_at.append(us or 0)
        c_srid.append(None if ev.step_run_id is None else d_srid.setdefault(ev.step_run_id, len(d_srid)))
        c_loop.append(None if ev.loop_id is None else d_loop.setdefault(ev.loop_id, len(d_loop)))
        c_trid.append(traw)
        c_pack.append(packing)
        c_body.append(body)
        c_hash.append(h if n == last else b"")  # the batch's last hash vouches for every event of it
        if ev.name in COMMAND_EVENTS:
            for col, v in zip(cmds, (eid, ev.execution_id, ev.sequence, ev.step, ev.step_run_id,
                                     us or 0), strict=True):  # fmt: skip
                col.append(v)
    return cols, cmds


def _decode(skipped: list[tuple[str, str]], seq: int, event_id: str | None, eid: str, name: str, us: int,
            body: bytes, packed: tuple[Any, ...] | None) -> Event | None:  # fmt: skip
    """One row of events.feather as its Event (None, and the reason in ``skipped``, if it cannot be)."""
    try:
        if event_id is None:
            raise ValueError("the event id is derived from the execution's first event, which is missing")
        if packed is not None:
            step, status, srid, loop, traw, packing = packed
            trid = uuid_text(traw) if traw is not None else None
            if packing & PACK_IDS:  # the ids' text back, in the reverse order of _pack
                for mark, text in zip(_MARKS[::-1], (eid, loop, srid, trid), strict=True):
                    if text is not None:
                        body = body.replace(mark, text.encode("utf-8", "surrogatepass"))
            d = loads(body)
            if step is not None:
                d["step"] = step
            d["status"] = status
            if srid is not None:
                d["step_run_id"] = srid
            if loop is not None:
                d["loop_id"] = loop
            if trid is not None:
                d["task_run_id"] = trid
            entity = packing & PACK_ENTITY
            if entity:
                d["entity_id"] = (trid, srid, loop, eid)[entity - 1]
        else:
            d = loads(body)
        if "timestamp" not in d:
            d["timestamp"] = iso(us)
        d.update(event_id=event_id, execution_id=eid, sequence=seq, name=name)
        return Event.from_dict(d)
    except Exception as e:  # noqa: BLE001 - a bad row is skipped and reported, as the SQLite store does
        skipped.append((f"{eid}#{seq}", f"{type(e).__name__}: {str(e)[:200]}"))
        return None


def _pack(ev: Event, us: int | None) -> tuple[bytes, bytes | None, int]:
    """The event's body as the v3 layout keeps it - ``to_stored(envelope=False)`` without what its
    own columns hold (step, status, step_run_id, loop_id, a uuid task_run_id, an entity_id equal to
    one of the event's ids) and with those ids' text in the rest replaced by one control byte each
    (a task's outcome names its task_run_id again) - its task_run_id's bytes and its packing."""
    d = ev.to_stored(envelope=False)
    if us is None:  # a timestamp the created_at column cannot give back exactly: the body keeps it
        d["timestamp"] = ev.timestamp
    d.pop("step", None)
    d.pop("status", None)
    srid, loop, trid, ent = d.pop("step_run_id", None), d.pop("loop_id", None), ev.task_run_id, ev.entity_id
    traw = uuid_bytes(trid) if trid is not None else None
    if traw is not None:
        del d["task_run_id"]
    else:
        trid = None  # stays in the body, as given
    packing = 0
    if ent is not None:
        for code, text in enumerate((trid, srid, loop, ev.execution_id), 1):
            if text is not None and ent == text:
                packing = code
                del d["entity_id"]
                break
    body = dumps_bytes(d)
    if len(body) * 40 + 1024 > _recorder.MAX_EVENT_BYTES:  # may be over: measured as the others measure
        check_event_size(ev, len(dumps_bytes(ev.to_stored(envelope=False))))
    if not _MARK_RE.search(body):  # (JSON text never holds one raw: this is a guard)
        for mark, text in zip(_MARKS, (trid, srid, loop, ev.execution_id), strict=True):
            if text:
                raw = text.encode("utf-8", "surrogatepass")
                if raw in body:
                    body = body.replace(raw, mark)
                    packing |= PACK_IDS
    return body, traw, packing


def _safe(execution_id: str) -> str:
    """An execution id as a folder name: ids are uuid7 text; anything else is refused."""
    if not execution_id or "/" in execution_id or "\\" in execution_id or execution_id in (".", ".."):
        raise ValueError(f"execution id {execution_id!r} cannot name a local folder")
    return execution_id
