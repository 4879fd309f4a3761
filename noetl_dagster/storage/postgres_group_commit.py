"""Group commit: concurrent appends of one process coalesced into one statement per round trip.

Several executions running in threads of one process (a worker serving many requests) each
flush their events at step boundaries. Sent one by one, every flush is a statement and a
commit of its own, and on the Postgres event store they queue behind one another on the
append lock. ``GroupCommit`` is the classic leader/follower scheme (as in database WALs):

* a caller that finds no round in flight becomes the *leader*: it takes every request
  queued so far (its own first) and runs them as one batch (``run_batch``), on its own thread;
* callers arriving meanwhile queue and wait; when the round ends, each one in it is woken
  with its own result, and the oldest request still queued is promoted to lead the next round.

Durability is unchanged: a caller returns only after the statement holding its events has
committed (or raises the error that statement raised). A batch refused for a reason that may
belong to one request only (``split_on``: a re-sent event, a bad value) is re-run request by
request with ``run_one``, so each caller gets exactly the outcome it would have had alone.
A single-threaded caller is always its own leader: no thread, no hand-off, no added latency.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any, Generic, TypeVar

T = TypeVar("T")
R = TypeVar("R")


class _Request(Generic[T]):
    __slots__ = ("item", "result", "error", "done", "promoted", "wake")

    def __init__(self, item: T):
        self.item = item
        self.result: Any = None
        self.error: BaseException | None = None
        self.done = False
        self.promoted = False
        self.wake = threading.Lock()
        self.wake.acquire()  # released by the round that finishes this request, or that promotes it

    def outcome(self) -> Any:
        if self.error is not None:
            raise self.error
        return self.result


class GroupCommit(Generic[T, R]):
    """Coalesce concurrent ``submit`` calls into batches; one batch in flight at a time."""

    def __init__(
        self,
        run_batch: Callable[[list[T]], list[R]],
        run_one: Callable[[T], R],
        *,
        split_on: Callable[[BaseException], bool] = lambda e: False,
        weight: Callable[[T], int] = lambda item: 1,
        max_weight: int = 10_000,
    ):
        self._run_batch = run_batch
        self._run_one = run_one
        self._split_on = split_on
        self._weight = weight
        self._max_weight = max_weight
        self._mutex = threading.Lock()
        self._queue: deque[_Request[T]] = deque()
        self._busy = False  # a leader is running a round (or has been promoted to)
        # counters for benchmarks and tests: rounds run, requests served, largest round
        self.rounds = 0
        self.requests = 0
        self.largest = 0

    def submit(self, item: T) -> R:
        req: _Request[T] = _Request(item)
        with self._mutex:
            self._queue.append(req)
            lead = not self._busy
            self._busy = True
        if not lead:
            try:
                req.wake.acquire()  # done by another round, or promoted to lead the next one
            except (
                BaseException
            ):  # interrupted (KeyboardInterrupt in the main thread): never strand the queue
                self._abandon(req)
                raise
            if req.done:
                return req.outcome()
        self._lead()
        return req.outcome()

    def _take(self) -> list[_Request[T]]:
        with self._mutex:
            batch = [self._queue.popleft()]  # the leader's own request is the oldest one queued
            total = self._weight(batch[0].item)
            while self._queue and total + (w := self._weight(self._queue[0].item)) <= self._max_weight:
                batch.append(self._queue.popleft())
                total += w
        return batch

    def _lead(self) -> None:
        batch = self._take()
        try:
            self._run(batch)
        finally:
            for r in batch:
                if not r.done:  # only if _run itself was interrupted (KeyboardInterrupt...)
                    r.error, r.done = RuntimeError("group commit round interrupted"), True
            with self._mutex:
                self.rounds += 1
                self.requests += len(batch)
                self.largest = max(self.largest, len(batch))
                nxt = self._promote_locked()
            for r in batch[1:]:  # batch[0] is this thread's own request
                r.wake.release()
            if nxt is not None:
                nxt.wake.release()  # promoted: not done, so it leads the next round

    def _promote_locked(self) -> _Request[T] | None:
        nxt = self._queue[0] if self._queue else None
        self._busy = nxt is not None
        if nxt is not None:
            nxt.promoted = True
        return nxt

    def _abandon(self, req: _Request[T]) -> None:
        """A waiting caller gives up: out of the queue, and if it had been promoted, the next one leads."""
        with self._mutex:
            if req.done or req not in self._queue:
                return  # finished, or taken into a round already (that round completes it)
            self._queue.remove(req)
            nxt = self._promote_locked() if req.promoted else None
        if nxt is not None:
            nxt.wake.release()

    def _run(self, batch: list[_Request[T]]) -> None:
        if len(batch) == 1:  # alone: exactly the path without grouping
            self._run_each(batch)
            return
        try:
            results = self._run_batch([r.item for r in batch])
        except Exception as e:  # noqa: BLE001 - given to the callers, or split per request
            if self._split_on(e):
                self._run_each(batch)
            else:
                for r in batch:
                    r.error, r.done = e, True
            return
        for r, res in zip(batch, results, strict=True):
            r.result, r.done = res, True

    def _run_each(self, batch: Sequence[_Request[T]]) -> None:
        for r in batch:
            try:
                r.result = self._run_one(r.item)
            except Exception as e:  # noqa: BLE001 - this caller's own error
                r.error = e
            r.done = True
