"""Reference-first results: :class:`Offloader` turns a big value into a signed ``$ref`` envelope
in the payload store and reads one back through the locator (storage/locator.py).

The engine's recorder offloads every result over the inline limit (``Recorder.offload``) and its
state resolves them (``ExecutionState.result``) as the execution's tenant and project.
"""

from __future__ import annotations

import os
from typing import Any

from noetl_dagster.dsl.locator import DEFAULT_LAYOUT, ObjectLayout
from noetl_dagster.storage.locator import Locator
from noetl_dagster.storage.payload import DEFAULT_INLINE_LIMIT, PayloadStore, ResultRef, checksum_of, is_ref
from noetl_dagster.util.jsonstream import dumps_bytes, is_plain_json, json_size_bound
from noetl_dagster.util.jsonutil import loads


class Offloader:
    """Turns a value into itself (small) or a ``$ref`` envelope (large).

    With ``tenant`` and ``project`` the keys get the shard prefix of the layout."""

    def __init__(
        self,
        store: PayloadStore,
        inline_limit: int = DEFAULT_INLINE_LIMIT,
        *,
        tenant: str | None = None,
        project: str | None = None,
        layout: ObjectLayout = DEFAULT_LAYOUT,
        locator: Locator | None = None,
        data_dir: str | os.PathLike[str] | None = None,
    ):
        self.store = store
        self.inline_limit = inline_limit
        self.key_prefix = layout.prefix(tenant, project) if tenant and project else ""
        self.data_dir = data_dir
        # storage.locator.Locator: signs what is written here and is the gate every read passes
        self._locator = locator
        # the value offloaded last and its envelope: a task's result is offloaded again at once as
        # its step's result, and must not be written twice
        self._last: tuple[Any, ResultRef] | None = None
        self._last_plain: tuple[Any, bool] | None = None
        self._last_owner: tuple[str, str] | None = None

    @property
    def locator(self) -> Locator:
        if self._locator is None:
            self._locator = Locator(self.store, data_dir=self.data_dir, key_prefix=self.key_prefix)
        return self._locator

    def maybe_offload(
        self, value: Any, key: str, *, execution_id: str | None = None, owner: tuple[str, str] | None = None
    ) -> Any:
        """``value`` itself when its JSON text is at most ``inline_limit`` bytes, else a ``$ref``
        carrying the signed capability of ``owner`` (tenant, project; default ``default/default``).

        The size is decided from a lower bound that stops at the limit, and a big value is
        streamed to the store, so memory stays about the value itself (issue 14.8)."""
        if value is None or isinstance(value, (bool, int, float)):
            return value
        if isinstance(value, str) and len(value) < self.inline_limit // 4:
            return value
        owner = owner or ("default", "default")
        last = self._last
        # the same (live) object: its payload is already written, and signed for the same owner
        if last is not None and last[0] is value and self._last_owner == owner:
            return last[1].envelope()
        key = self.key_prefix + key + ".json"
        rows = len(value) if isinstance(value, list) else None
        if json_size_bound(value, self.inline_limit) <= self.inline_limit:
            data = dumps_bytes(value)  # near the limit: small enough to measure exactly
            if len(data) <= self.inline_limit:
                return value
            ref = self.store.typed_ref(self.store.put_bytes(key, data), len(data), checksum_of(data), "json",
                                       rows=rows, content_type="application/json", execution_id=execution_id)  # fmt: skip
        else:
            ref = self.store.put_json(key, value, rows=rows, execution_id=execution_id)
        ref = self.locator.sign(ref, *owner)
        self._last, self._last_owner = (value, ref), owner
        return ref.envelope()

    def resolve(self, value: Any, reader: tuple[str, str] | None = None) -> Any:
        """``value``, or the value a ``$ref`` names when ``reader`` (tenant, project; default
        ``default/default``) may read it (storage/locator.py: else RefRefused)."""
        if is_ref(value):
            ref = ResultRef.from_dict(value["$ref"])
            tenant, project = reader or ("default", "default")
            self.locator.authorize(ref, tenant, project)  # before the live copy below too
            last = self._last
            # the payload this process just wrote: the live value, when reading it back would give an
            # equal value of the same types (else a reader would see what replay does not)
            if last is not None and last[1].uri == ref.uri and last[1].checksum == ref.checksum:
                if self._last_plain is None or self._last_plain[0] is not last:
                    self._last_plain = (last, is_plain_json(last[0]))  # once per value, not per read
                if self._last_plain[1]:
                    return last[0]
            return loads(self.locator.read(ref, tenant, project))
        return value
