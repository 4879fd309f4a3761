"""The event log's hash chain (issue 41): each event carries the hash of the previous event of its
execution, so an edited, deleted, inserted or reordered event shows.

``hash(n) = sha256(hash(n-1) || sequence(n) as 8 bytes big-endian || canonical(n))`` with 32 zero
bytes before the first chained event. ``canonical`` is the event's stored JSON form without its
sequence (``dumps(to_stored())`` minus ``sequence``, the text the Postgres store writes after the
sequence): every store reads an event back exactly as appended, so the bytes are the same
whichever table, segment or archive it came from. The stores compute the chain where they number
the events (inside their write transaction); ``check_chain`` recomputes it from what was read.

An execution written before the chain existed has no hashes ("unchained"); one appended to after
the upgrade is chained from its first hashed event on (its older events stay unchained)."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from noetl_dagster.engine.events import Event
from noetl_dagster.util.jsonutil import dumps, dumps_bytes

GENESIS = bytes(32)


class LogTampered(RuntimeError):
    """An event log or archive that shows an edit (a broken chain, a bad signature): refused, exit 1."""


class ChainBroken(LogTampered):
    """The event log of an execution was altered: ``sequence`` is the first event that does not verify."""

    def __init__(self, execution_id: str, sequence: int, reason: str, where: str = ""):
        self.execution_id, self.sequence, self.reason = execution_id, sequence, reason
        super().__init__(
            f"execution {execution_id}{where}: the event log was altered at sequence {sequence} ({reason})"
        )


def canonical_text(ev: Event) -> str:
    """The event's stored JSON form without its sequence (the chain binds the sequence itself)."""
    d = ev.to_stored()
    del d["sequence"]
    return dumps(d)


def canonical_bytes(ev: Event) -> bytes:
    """``canonical_text(ev)`` as the UTF-8 bytes the hash reads (the encoder's own: no str between)."""
    d = ev.to_stored()
    del d["sequence"]
    return dumps_bytes(d)


def event_link(prev: bytes, sequence: int, ev: Event) -> bytes:
    """``link(prev, sequence, canonical_text(ev))``, the same hash, from ``canonical_bytes``."""
    h = hashlib.sha256(prev)
    h.update(sequence.to_bytes(8, "big"))
    h.update(canonical_bytes(ev))
    return h.digest()


def link(prev: bytes, sequence: int, text: str) -> bytes:
    """The hash of the event numbered ``sequence`` whose canonical text is ``text``, after ``prev``."""
    h = hashlib.sha256(prev)
    h.update(sequence.to_bytes(8, "big"))
    h.update(text.encode("utf-8", "surrogatepass"))
    return h.digest()


def event_hash(prev: bytes, ev: Event) -> bytes:
    return event_link(prev, ev.sequence or 0, ev)


@dataclass
class ChainReport:
    """What ``check_chain`` found: status ``ok`` | ``unchained`` | ``broken``."""

    execution_id: str
    status: str
    events: int = 0
    head: str | None = None  # hex of the last event's hash (ok)
    last_sequence: int = 0
    chained_from: int | None = None  # the first hashed sequence (older events are unchained)
    sequence: int | None = None  # broken: the first bad event
    reason: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if v is not None}

    def raise_if_broken(self, where: str = "") -> None:
        if self.status == "broken":
            raise ChainBroken(self.execution_id, self.sequence or 0, self.reason or "", where)


def check_chain(
    execution_id: str,
    entries: Iterable[tuple[int, Event | None, bytes | None]],
    expected_head: str | None = None,
) -> ChainReport:
    """Walk ``(sequence, event or None if undecodable, stored hash or None)`` in sequence order.

    A stored hash may be shorter than 32 bytes (a segment keeps an 8-byte mark per event and the full
    hash of its last one): it must be the recomputed hash's prefix. An empty one (b"", the local
    files keep only each batch's last hash) is checked by the next stored hash, which covers it; a
    log that ends on empty ones is broken ("hash missing"), and a mismatch names the first event
    the failing hash covers. ``expected_head`` (hex, from an
    archive's manifest) must equal the recomputed head; an execution without it can be rewritten
    whole by whoever can rewrite the store (docs/limits.md)."""
    prev: bytes | None = None  # None until the first hashed event
    chained_from: int | None = None
    deferred: int | None = None  # the first event since the last stored hash whose own is empty
    expected = 1
    count = 0

    def broken(seq: int, reason: str) -> ChainReport:
        return ChainReport(execution_id, "broken", count, None, expected - 1, chained_from, seq, reason)

    for seq, ev, stored in entries:
        if seq != expected:  # the event after a deleted one (or one added past the end) is the first bad
            return broken(seq, f"sequence {expected} is missing" if seq > expected else "its sequence again")
        if ev is None:
            return broken(seq, "undecodable")
        if ev.execution_id != execution_id or (ev.sequence is not None and ev.sequence != seq):
            return broken(seq, "moved from another place")
        if stored is None:
            if prev is not None:
                return broken(seq, "hash missing")
        else:
            if prev is None:
                prev, chained_from = GENESIS, seq
            want = event_hash(prev, ev)
            if not stored:
                deferred = seq if deferred is None else deferred
            elif want[: len(stored)] != stored:
                return broken(seq if deferred is None else deferred, "hash mismatch")
            else:
                deferred = None
            prev = want
        count += 1
        expected += 1
    if deferred is not None:  # events after the last stored hash: nothing vouches for them
        return broken(deferred, "hash missing")
    if prev is None:
        if expected_head is not None:  # hashes stripped from a log whose head was recorded
            return broken(1, "hash missing")
        return ChainReport(execution_id, "unchained", count, None, expected - 1)
    head = prev.hex()
    if expected_head is not None and head != expected_head:
        return broken(expected - 1, "head differs from the signed or archived head")
    return ChainReport(execution_id, "ok", count, head, expected - 1, chained_from)


def chain_hashes(entries: Iterable[tuple[int, Event | None, bytes | None]]) -> list[bytes | None]:
    """Each entry's full hash, recomputed (None where unchained): for a log ``check_chain`` passed,
    whose segments keep only a mark per event (an archive writes the full hashes)."""
    prev: bytes | None = None
    out: list[bytes | None] = []
    for _seq, ev, stored in entries:
        if stored is None or ev is None:
            out.append(None)
            continue
        prev = event_hash(prev or GENESIS, ev)
        out.append(prev)
    return out
