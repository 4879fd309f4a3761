"""Storage tests use the moto S3 fixtures of tests/conftest.py, and the cloud emulators below."""

import pytest


@pytest.fixture(scope="module")
def emulators(tmp_path_factory):
    """One emulator process per cloud for the module (started lazily, stopped at the end)."""
    from tests.storage.emulators import Emulator

    running: dict[str, Emulator] = {}

    def get(kind: str) -> Emulator:
        if kind not in running:
            running[kind] = Emulator(kind, tmp_path_factory.mktemp(f"emu-{kind}")).start()
        return running[kind]

    yield get
    for emu in running.values():
        emu.stop()
