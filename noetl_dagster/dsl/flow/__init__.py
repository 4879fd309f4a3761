"""Flow syntax front end (seed 002): ``A → B → C`` text compiled to playbooks and mermaid.

>>> from noetl_dagster.dsl.flow import compile_flow, flow_to_mermaid
>>> playbook = compile_flow("@task A (- kind: noop -)\\nA")   # a playbook dict
>>> print(flow_to_mermaid("A → [ B C ] → D"))                    # stateDiagram-v2

See docs/flow.md for the language and how it maps onto steps, arcs and tools.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from noetl_dagster.dsl.flow.errors import FlowCompileError, FlowError, FlowSyntaxError
from noetl_dagster.dsl.flow.graph import FlowGraph, Node, NodeKind, build_graph
from noetl_dagster.dsl.flow.parser import parse_flow
from noetl_dagster.dsl.source import read_text_file

FLOW_SUFFIX = ".flow"

__all__ = [
    "FLOW_SUFFIX", "FlowCompileError", "FlowError", "FlowGraph", "FlowSyntaxError", "Node", "NodeKind",
    "build_graph", "compile_flow", "flow_graph", "flow_to_mermaid", "is_flow_file", "load_flow",
    "load_flow_playbook", "parse_flow", "playbook_yaml", "rebase_resources",
]  # fmt: skip


def is_flow_file(path: str | os.PathLike[str]) -> bool:
    return str(path).endswith(FLOW_SUFFIX)


def flow_graph(text: str, *, file: str | None = None) -> FlowGraph:
    """Parse and build the workflow graph (labels and subflows resolved; tasks not resolved to tools)."""
    return build_graph(parse_flow(text, file))


def flow_to_mermaid(text: str, *, file: str | None = None, direction: str = "LR", notes: bool = True) -> str:
    """The flow as a mermaid ``stateDiagram-v2``."""
    from noetl_dagster.dsl.flow.mermaid import to_mermaid

    return to_mermaid(flow_graph(text, file=file), direction=direction, notes=notes)


def compile_flow(
    text: str, *, file: str | None = None, name: str | None = None, validate: bool = True
) -> dict[str, Any]:
    """Compile flow text to a playbook dict (standard form).

    ``name`` is used when the flow has no ``@flow`` declaration. With
    ``validate`` the result is checked with the playbook validator and any
    issue is raised as :class:`FlowCompileError`.
    """
    from noetl_dagster.dsl.flow.compiler import compile_graph

    graph = flow_graph(text, file=file)
    playbook = compile_graph(graph, name=name, file=file, text=text)
    if validate:
        _validate(playbook, file)
    return playbook


def _validate(playbook: dict[str, Any], file: str | None) -> None:
    from noetl_dagster.dsl.parse import parse_playbook

    _, issues = parse_playbook(playbook, source_file=file)
    if issues:
        detail = "; ".join(f"{i.path}: {i.rule}: {i.message}" for i in issues)
        raise FlowCompileError(
            f"the compiled playbook is not valid: {detail}", file=file, rule="invalid-playbook"
        )


def load_flow(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read and compile a ``.flow`` file: the playbook dict (named after the file unless ``@flow`` names it).

    Relative resource URIs stay relative: they resolve against the folder of
    the playbook's source file, i.e. of this flow file.
    """
    p = Path(path)
    text = read_text_file(p, what="flow file")  # the bounded reader, with the YAML document size limit
    return compile_flow(text, file=str(p), name=p.stem)


def load_flow_playbook(path: str | os.PathLike[str]) -> Any:
    """A ``.flow`` file as a validated :class:`~noetl_dagster.dsl.model.Playbook` (runnable by either runner)."""
    from noetl_dagster.dsl.parse import load_playbook_dict

    return load_playbook_dict(load_flow(path), source_file=str(Path(path).resolve()))


def rebase_resources(
    playbook: dict[str, Any], from_dir: str | os.PathLike[str], to_dir: str | os.PathLike[str]
) -> None:
    """Rewrite relative resource paths of a compiled flow for a playbook written to another folder."""
    src, dst = Path(from_dir).resolve(), Path(to_dir).resolve()
    if src == dst:
        return
    for step in playbook.get("workflow", []):
        for task in step.get("tool", []):
            uri = task.get("uri") if task.get("kind") == "resource" else None
            if isinstance(uri, str) and uri and ":" not in uri.split("/", 1)[0] and not os.path.isabs(uri):
                task["uri"] = os.path.relpath(src / uri, dst)


def playbook_yaml(playbook: dict[str, Any]) -> str:
    """YAML text of a playbook dict: keys in order, multi-line strings as ``|`` blocks."""
    import yaml

    class _Dumper(yaml.SafeDumper):
        pass

    def _str(dumper: yaml.SafeDumper, value: str) -> Any:
        style = "|" if "\n" in value else None
        return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)

    _Dumper.add_representer(str, _str)
    return yaml.dump(
        playbook, Dumper=_Dumper, sort_keys=False, allow_unicode=True, default_flow_style=False, width=110
    )
