"""Flow front end benchmark (issue 6): how long compiling a large flow takes.

A generated flow of N statements (labels, subflows, `>` merges and guards:
about 8 nodes per statement) is parsed, built into its graph, compiled to a
playbook (and validated) and written as mermaid. The baseline, measured in the
same process, is reading the *compiled* playbook the ordinary way: parsing its
YAML text and validating it with ``load_playbook_dict``. The ratio says what
writing the workflow as a flow costs over shipping the YAML itself.
Target: compile + validate within 3x the YAML baseline.

Run: ``python -m benchmarks.bench_flow [--statements N]`` or
``python -m benchmarks --only flow``. Always exits 0; read PASS / MISS.
"""

from __future__ import annotations

import argparse
import time

TARGET_RATIO = 3.0


def make_flow(statements: int) -> str:
    lines = [
        "@flow bench",
        "@task T (- {kind: noop} -);",
        "@task U (- {kind: python, code: 'result = input'} -);",
    ]
    for i in range(statements):
        lines.append(f"T :o{i} → [ U ? `$.ok` T ] → > U;")
        lines.append(f":o{i} → T → :m{i};")
        lines.append(f"U → :m{i} U")
    return "\n".join(lines) + "\n"


def _best(fn, repeat: int = 2) -> float:
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--statements", type=int, default=120)
    args = ap.parse_args(argv)

    import yaml

    from noetl_dagster.dsl import load_playbook_dict
    from noetl_dagster.dsl.flow import compile_flow, flow_graph, parse_flow, playbook_yaml
    from noetl_dagster.dsl.flow.compiler import compile_graph
    from noetl_dagster.dsl.flow.mermaid import to_mermaid

    text = make_flow(args.statements)
    graph = flow_graph(text)
    pb = compile_flow(text)
    yaml_text = playbook_yaml(pb)
    compile_flow(text)  # warm caches (grammar, registry) before timing

    t_parse = _best(lambda: parse_flow(text))
    t_graph = _best(lambda: flow_graph(text))
    t_compile = _best(lambda: compile_graph(flow_graph(text), text=text))
    t_full = _best(lambda: compile_flow(text))
    t_mermaid = _best(lambda: to_mermaid(graph))
    t_baseline = _best(lambda: load_playbook_dict(yaml.safe_load(yaml_text)))

    ratio = t_full / t_baseline
    print(f"flow: {args.statements} statements, {len(text) // 1024} KiB -> {len(graph.nodes)} nodes, "
          f"{len(graph.edges)} edges, {len(pb['workflow'])} steps ({len(yaml_text) // 1024} KiB of YAML)")  # fmt: skip
    print(f"  parse            {t_parse * 1000:8.1f} ms")
    print(f"  parse + graph    {t_graph * 1000:8.1f} ms")
    print(f"  compile (no validation) {t_compile * 1000:8.1f} ms")
    print(f"  compile + validate      {t_full * 1000:8.1f} ms")
    print(f"  mermaid          {t_mermaid * 1000:8.1f} ms")
    print(f"  baseline: YAML parse + validate of the compiled playbook {t_baseline * 1000:8.1f} ms")
    verdict = "PASS" if ratio <= TARGET_RATIO else "MISS"
    print(f"  ratio compile+validate / baseline = {ratio:.2f}x (target <= {TARGET_RATIO:g}x) {verdict}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
