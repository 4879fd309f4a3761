"""Graph algorithms on plain adjacency lists (used by validation and by the engine)."""

from __future__ import annotations


def strongly_connected(order: list[str], succ: dict[str, list[str]]) -> list[list[str]]:
    """Strongly connected components (iterative Tarjan, linear), each in ``order``, in topological order."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on: set[str] = set()
    stack: list[str] = []
    out: list[list[str]] = []
    counter = 0
    pos = {s: k for k, s in enumerate(order)}

    for root in order:
        if root in index:
            continue
        work = [(root, 0)]
        while work:
            v, i = work.pop()
            if i == 0:
                index[v] = low[v] = counter
                counter += 1
                stack.append(v)
                on.add(v)
            nbrs = succ.get(v, [])
            recurse = False
            while i < len(nbrs):
                w = nbrs[i]
                i += 1
                if w not in index:
                    work.append((v, i))
                    work.append((w, 0))
                    recurse = True
                    break
                if w in on:
                    low[v] = min(low[v], index[w])
            if recurse:
                continue
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                out.append(sorted(comp, key=pos.__getitem__))
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[v])
    out.reverse()  # Tarjan yields reverse topological order
    return out
