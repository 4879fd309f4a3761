"""What an engine lends its worker and tools: the keychain, credentials and per-execution resources."""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from noetl_dagster.dsl.model import Playbook


class EngineServices:
    """The engine's keychain (built once, its secrets redacted) and its shared resources (closed at the end)."""

    services: Any
    playbook: Playbook
    state: Any
    env: Any
    recorder: Any
    execution_id: str
    _keychain: Any
    _keychain_lock: threading.Lock
    _resources: dict[str, Any]
    _resources_lock: threading.Lock

    def keychain(self) -> Any:
        if self._keychain is not None:
            return self._keychain
        with self._keychain_lock:  # parallel loop iterations ask at once: build it once
            if self._keychain is not None:
                return self._keychain
            factory = self.services.keychain_factory or _default_keychain
            kc = factory(self.playbook)
            if callable(getattr(kc, "bind", None)):
                # declarations render against this execution; every secret resolved later is redacted
                kc.bind(
                    context=lambda: {
                        **self.state.workload,
                        "workload": self.state.workload,
                        "ctx": self.state.ctx,
                        "execution_id": self.execution_id,
                    },  # fmt: skip
                    render=self.env.render,
                    on_secret=self.recorder.redactor.add,
                )
            else:
                try:
                    self.recorder.redactor.add(kc.secret_values())
                except Exception:  # noqa: BLE001 - a provider failing to list secrets must not stop the run
                    pass
            self._keychain = kc
        return self._keychain

    def keychain_namespace(self) -> Mapping[str, Any]:
        if not self.playbook.keychain:
            return {}
        return self.keychain().namespace()

    def credential(self, name: str) -> dict[str, Any]:
        # the keychain reports the secret fields (passwords, tokens) to the redactor, not hosts or names
        return self.keychain().credential(name)

    def resource(self, key: str, factory: Callable[[], Any]) -> Any:
        res = self._resources.get(key)
        if res is None:
            with self._resources_lock:  # one pool per key even when parallel iterations ask at once
                res = self._resources.get(key)
                if res is None:
                    res = self._resources[key] = factory()
        return res

    def close_resources(self) -> None:
        for r in self._resources.values():
            close = getattr(r, "close", None)
            if callable(close):
                try:
                    close()
                except Exception:  # noqa: BLE001
                    pass
        self._resources.clear()


def _default_keychain(pb: Playbook) -> Any:
    from noetl_dagster.engine.keychain import Keychain  # noqa: PLC0415 - providers load lazily

    return Keychain(pb.keychain, base_dir=pb.base_dir)
