"""Run the CLI or a snippet as on a core install: every module of an optional extra is unimportable.

``python no_extras.py cli ARGS...`` runs ``noetl-dagster ARGS...``; ``python no_extras.py code SNIPPET``
executes SNIPPET. The blocked names are exactly noetl_dagster.util.extras.EXTRA_MODULES, so a
module that imports an optional package at import time fails here as it would after
``pip install noetl-dagster`` without extras (tests/packaging/test_extras.py).
"""

from __future__ import annotations

import sys

from noetl_dagster.util.extras import EXTRA_MODULES

BLOCKED = {m for mods in EXTRA_MODULES.values() for m in mods}


class _Blocker:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


sys.meta_path.insert(0, _Blocker())

if __name__ == "__main__":
    what, *rest = sys.argv[1:]
    if what == "cli":
        from noetl_dagster.commands.main import main

        sys.argv = ["noetl-dagster", *rest]
        main()
    else:
        exec(compile(rest[0], "<snippet>", "exec"), {"__name__": "__snippet__"})
