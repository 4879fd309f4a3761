"""Template sandbox (issue 29.2): hostile templates under an rlimit, and the cost of ordinary ones.

1. Hostile templates: each runs in a fresh child process with RLIMIT_AS (``--rlimit-mb``,
   1024 by default) and a wall-clock timeout (``--timeout``, 60 s). The child renders the
   template as the engine does (``render_str``, then ``json.dumps`` of a native value) and
   reports the outcome (``TemplateError`` = rejected cleanly; anything else is a MISS), the
   wall time and its peak RSS (``VmHWM``) next to its RSS before rendering.
   Target: every case rejected as a TemplateError, peak RSS <= 256 MB.
2. Ordinary templates: a mix of the engine's everyday templates (``{{ ctx.i + 1 }}``,
   conditions, a small loop, filters) rendered ``--renders`` times in-process, best of 5;
   printed in microseconds per render so runs before/after a change can be compared.

Run: ``python -m benchmarks.bench_templates [--only hostile|ordinary]`` or
``python -m benchmarks --only templates``. Always exits 0; read PASS / MISS.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

RSS_TARGET_MB = 256.0

# (name, template): the cases of issue 29 first, then ones of the same families
HOSTILE: list[tuple[str, str]] = [
    ("join 2.5e9 chars", "{{ (['x'*1000000]*2500)|join|length }}"),
    ("chained ~ 1e9 chars", "{% set a = 'x'*16000000 %}{{ (" + " ~ ".join(["a"] * 64) + ")|length }}"),
    ("tojson 2.5e9", "{{ (['x'*1000000]*2500)|tojson|length }}"),
    ("str.format 2.5e9", "{{ '{}'.format(['x'*1000000]*2500)|length }}"),
    ("% 2.5e9", "{{ ('%s' % ((['x'*1000000]*2500),))|length }}"),
    ("expandtabs 2.5e9", "{{ ('\\t'*1000000).expandtabs(2500)|length }}"),
    ("sum of lists (quadratic)", "{{ sum([[0]*1000]*10000, []) }}"),
    ("max key=lipsum", "{{ max(range(100000)|list, key=lipsum) }}"),
    (
        "nested for over a set list",
        "{% set l = range(100000)|list %}{% for a in l %}{% for b in l %}{% endfor %}{% endfor %}x",
    ),
    ("2 ** 30000 (int->str)", "{{ 2 ** 30000 }}"),
    ("output of a shared list", "{% set s = 'x'*1000000 %}{{ [s]*1000 }}"),
    ("native shared list", "{% set s = 'x'*1000000 %}{{ [s]*100000 }}"),
    (
        "kept alive in a list",
        "{% set ns = namespace(l=[]) %}{% for i in range(1000) %}{% set ns.l = ns.l + ['x'*10000000 ~ i] %}{% endfor %}{{ ns.l|length }}",
    ),
    ("split into 8e6 strings", "{{ ('a '*8000000).split()|length }}"),
    ("int.to_bytes 1e9", "{{ (1).to_bytes(1000000000, 'big')|length }}"),
    ("indent 1e6 lines", "{{ ('\\n'*1000000)|indent(1000, first=True)|length }}"),
    ("translate x1000", "{{ ('x'*1000000).translate({120: 'y'*1000})|length }}"),
    ("join with a long separator", "{{ (range(100000)|list)|join(','*1000)|length }}"),
    ("sum filter of lists", "{{ ([[0]*2]*1000000)|sum(start=[])|length }}"),
    ("batch(1) of 1e6", "{{ ([0]*1000000)|batch(1)|list|length }}"),
    ("escape x5", "{{ ('<'*16000000)|e|length }}"),
    ("urlencode x9", "{{ ('\\u00e9'*8000000)|urlencode|length }}"),
    ("fromjson 5e6 lists", "{{ ('[' ~ '[],'*5000000 ~ '[]]')|fromjson|length }}"),
    ("pprint shared", "{% set s = 'x'*1000000 %}{{ ([s]*1000)|pprint|length }}"),
    (
        "macro doubling",
        "{% macro f(n) %}{% if n %}{{ f(n-1) }}{{ f(n-1) }}{% endif %}x{% endmacro %}{{ f(30)|length }}",
    ),
    ("sorted key=lipsum", "{{ sorted(range(100000)|list, key=lipsum)|length }}"),
    ("format widths", "{{ ('%9999999d' * 100) % ((1,)*100) }}"),
    ("str() of a shared list", "{% set s = 'x'*1000000 %}{{ str([s]*1000)|length }}"),
    ("upper x3", "{{ ('\\ufb03'*10000000).upper()|length }}"),
    ("wordwrap long wrapstring", "{{ ('a '*1000000)|wordwrap(1, wrapstring='y'*1000)|length }}"),
    ("attr __class__ in a string", "a{{ workload|attr('__class__') }}b"),
    ("attr __class__ is defined", "{{ (workload|attr('__class__')) is defined }}"),
]


def _rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 1e6


def _peak_rss_mb() -> float:
    # VmHWM, not ru_maxrss: the child's ru_maxrss starts at its parent's RSS at fork
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmHWM:")) * 1024 / 1e6


def _child(index: int, rlimit_mb: int) -> None:
    from noetl_dagster.dsl.templates import TemplateError, template_env

    env = template_env()
    env.render_str("{{ [1, 2]|join(',') ~ 'x'|upper }}", {"workload": {}})  # imports, first compile
    if rlimit_mb:
        resource.setrlimit(resource.RLIMIT_AS, (rlimit_mb * 1024 * 1024, rlimit_mb * 1024 * 1024))
    before = _rss_mb()
    t0 = time.perf_counter()
    try:
        out = env.render_str(HOSTILE[index][1], {"workload": {"a": 1}})
        json.dumps(out)  # as the engine records a native value
        outcome = f"accepted ({type(out).__name__})"
    except TemplateError as e:
        outcome = "TemplateError: " + e.message[:90]
    except BaseException as e:  # noqa: BLE001 - the figure is which one
        outcome = f"{type(e).__name__}: {str(e)[:80]}"
    wall = time.perf_counter() - t0
    print(
        "__BENCH__"
        + json.dumps(
            {"outcome": outcome, "wall_s": wall, "rss_before_mb": before, "peak_rss_mb": _peak_rss_mb()}
        )
    )


def hostile(args: argparse.Namespace) -> list[dict[str, Any]]:
    root = Path(__file__).resolve().parents[1]
    rows = []
    for i, (name, _src) in enumerate(HOSTILE):
        cmd = [
            sys.executable,
            "-m",
            "benchmarks.bench_templates",
            "--case",
            str(i),
            "--rlimit-mb",
            str(args.rlimit_mb),
        ]
        t0 = time.perf_counter()
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, cwd=root, timeout=args.timeout)
            line = next((x for x in proc.stdout.splitlines() if x.startswith("__BENCH__")), None)
            if line is None:
                tail = (proc.stderr.strip().splitlines() or ["?"])[-1]
                row = {"outcome": f"crashed (exit {proc.returncode}): {tail[:80]}", "wall_s": time.perf_counter() - t0,
                       "rss_before_mb": float("nan"), "peak_rss_mb": float("nan")}  # fmt: skip
            else:
                row = json.loads(line[len("__BENCH__") :])
        except subprocess.TimeoutExpired:
            row = {"outcome": f"timeout after {args.timeout:g} s", "wall_s": args.timeout,
                   "rss_before_mb": float("nan"), "peak_rss_mb": float("nan")}  # fmt: skip
        rows.append({"name": name, **row})
        _print_row(rows[-1])
    return rows


def _clean(r: dict[str, Any]) -> bool:
    """Rejected by a limit or the sandbox (not by running out of memory), under the RSS target."""
    return (r["outcome"].startswith("TemplateError") and "MemoryError" not in r["outcome"]
            and "out of memory" not in r["outcome"] and r["peak_rss_mb"] <= RSS_TARGET_MB)  # fmt: skip


def _print_row(r: dict[str, Any]) -> None:
    ok = _clean(r)
    print(f"  {r['name']:<28} {r['wall_s']:7.2f} s  peak {r['peak_rss_mb']:7.1f} MB (before {r['rss_before_mb']:5.1f})  "
          f"{'PASS' if ok else 'MISS'}  {r['outcome']}", flush=True)  # fmt: skip


ORDINARY = [
    "{{ (ctx.i or 0) + 1 }}",
    "{{ ctx.i < workload.n }}",
    "{{ workload.items | map(attribute='id') | list }}",
    "{{ workload.name | upper ~ '-' ~ ctx.i }}",
    "select * from t where id = {{ ctx.i }} and name = '{{ workload.name }}'",
    "{% for it in workload.items %}{{ it.id }}:{{ it.v | round(2) }},{% endfor %}",
    "{{ workload.items | tojson }}",
    "{{ '%s-%05d' % (workload.name, ctx.i) }}",
    "{{ {'a': ctx.i, 'b': [workload.n, 2, 3], 'c': workload.name ~ 'x'} }}",
    "{{ workload.items | selectattr('v', 'gt', 3) | map(attribute='id') | join(',') }}",
]


def ordinary(renders: int) -> float:
    from noetl_dagster.dsl.templates import template_env

    env = template_env()
    scope = {
        "ctx": {"i": 7},
        "workload": {"n": 100, "name": "abc", "items": [{"id": i, "v": i * 1.5} for i in range(10)]},
    }
    for src in ORDINARY:
        env.render_str(src, scope)  # compile once (cached by source, as in the engine)
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(renders):
            for src in ORDINARY:
                env.render_str(src, scope)
        best = min(best, time.perf_counter() - t0)
    per = best / (renders * len(ORDINARY)) * 1e6
    print(f"== ordinary templates: {len(ORDINARY)} templates x {renders:,} renders, best of 5 ==")
    print(f"  {per:8.2f} us per render ({best:.3f} s)")
    return per


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rlimit-mb", type=int, default=1024, help="RLIMIT_AS of each hostile child (0: none)")
    ap.add_argument("--timeout", type=float, default=60.0, help="seconds before a hostile child is killed")
    ap.add_argument("--renders", type=int, default=2000, help="renders of each ordinary template")
    ap.add_argument("--only", choices=["hostile", "ordinary"])
    ap.add_argument("--case", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.case is not None:
        _child(args.case, args.rlimit_mb)
        return
    if args.only != "ordinary":
        print(
            f"== hostile templates: each in a child with RLIMIT_AS {args.rlimit_mb} MB, timeout {args.timeout:g} s =="
        )
        rows = hostile(args)
        ok = sum(_clean(r) for r in rows)
        worst = max(
            (r["peak_rss_mb"] for r in rows if r["peak_rss_mb"] == r["peak_rss_mb"]), default=float("nan")
        )
        print(f"  rejected as TemplateError under {RSS_TARGET_MB:g} MB: {ok}/{len(rows)} "
              f"{'PASS' if ok == len(rows) else 'MISS'}   worst peak {worst:.1f} MB")  # fmt: skip
    if args.only != "hostile":
        ordinary(args.renders)


if __name__ == "__main__":
    main()
