"""Regenerate the golden files from a migrate implementation (run only on purpose:
`python tests/dsl/migrate/golden/regen.py [captured-inputs.json]`). The goldens pin the
output of the code as it was before the split into a package (issue 23)."""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
from test_migrate_golden import SHARED, render  # noqa: E402


def main() -> None:
    captured = json.loads(Path(sys.argv[1]).read_text()) if len(sys.argv) > 1 else None
    manifest = []
    if captured is None:
        manifest = json.loads((HERE / "manifest.json").read_text())
    else:
        for text, file in captured:
            if file.startswith(str(SHARED) + "/") and Path(file).read_text(encoding="utf-8") == text:
                rel = file[len(str(SHARED)) + 1 :]
                manifest.append(
                    {"id": "shared__" + rel.replace("/", "__"), "source": "shared:" + rel, "file": rel}
                )
            else:
                name = file[len(str(SHARED)) + 1 :] if file.startswith(str(SHARED) + "/") else Path(file).name
                h = hashlib.sha256(text.encode()).hexdigest()[:10]
                cid = f"{Path(name).stem[:60]}_{h}"
                (HERE / "inputs").mkdir(exist_ok=True)
                (HERE / "inputs" / f"{cid}.yaml").write_text(text, encoding="utf-8")
                manifest.append({"id": cid, "source": f"inputs/{cid}.yaml", "file": name})
        manifest.sort(key=lambda c: c["id"])
        (HERE / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    (HERE / "out").mkdir(exist_ok=True)
    from test_migrate_golden import read_input

    for c in manifest:
        (HERE / "out" / f"{c['id']}.txt").write_text(render(read_input(c), c["file"]), encoding="utf-8")


if __name__ == "__main__":
    main()
