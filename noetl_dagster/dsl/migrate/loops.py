"""Loops: ``loop.mode`` / ``max_in_flight`` -> ``loop.spec``; v1 loops (a loop step whose ``next`` chain
ends at an ``end_loop`` step) tried on a copy first and folded, the ``end_loop`` step's ``result``."""

from __future__ import annotations

import copy

from ruamel.yaml.comments import CommentedMap

from .base import MigratorBase
from .report import _Refuse
from .templates import (
    NameRef,
    Resolver,
    TemplateRewriteError,
    _group,
    _rewrite_all,
    rewrite_template,
    single_expression,
)
from .yamltree import _cm, _give_trailing, _index, _pop, _restyle, _take_trailing


class LoopMixin(MigratorBase):
    """Rules over loop steps and the v1 loop / end_loop pairs (the fold itself is in loop_body)."""

    # loop.mode -> loop.spec.mode
    def _loop(self, s: CommentedMap, path: tuple) -> None:
        loop = s.get("loop")
        if not isinstance(loop, dict):
            return
        moved = [k for k in ("mode", "max_in_flight") if k in loop]
        unknown = [k for k in loop if k not in ("in", "iterator", "spec", "mode", "max_in_flight")]
        if unknown:
            self.note("refused", "loop", f"loop keys {unknown} have no standard counterpart", loop, unknown[0],
                      (*path, "loop", unknown[0]))  # fmt: skip
        if not moved:
            return
        spec = loop.get("spec")
        if spec is None:
            spec = CommentedMap()
            loop["spec"] = spec
        if not isinstance(spec, dict):
            self.note(
                "refused", "loop", "`loop.spec` is not a mapping", loop, "spec", (*path, "loop", "spec")
            )
            return
        mode = loop.get("mode")
        if mode is not None and mode not in ("sequential", "parallel"):
            self.note("refused", "loop", f"loop mode {mode!r} has no counterpart (sequential / parallel)", loop, "mode",
                      (*path, "loop", "mode"))  # fmt: skip
            moved = [k for k in moved if k != "mode"]
        for k in moved:
            if k in spec:
                self.note(
                    "refused",
                    "loop",
                    f"`loop.{k}` and `loop.spec.{k}` both exist",
                    loop,
                    k,
                    (*path, "loop", k),
                )
                continue
            _pop(loop, k, spec)

    # -- v1 loops: a loop step whose `next` chain ends at an end_loop step -------------
    def _v1_loops(self) -> None:
        ends = {str(s["end_loop"]): s for s in self.steps.values() if "end_loop" in s}
        for loop_name, end in ends.items():
            loop = self.steps.get(loop_name)
            if loop is None or not isinstance(loop.get("loop"), dict) or "tool" in loop or "type" in loop:
                continue
            idx = self.doc["workflow"].index(loop)
            try:
                # a dry run on a copy first: a refusal must leave the real document untouched
                trial = type(self)(copy.deepcopy(self.doc), self.file)
                trial.v1 = self.v1
                trial._index_steps()
                trial._scan()
                trial._collapse(trial.steps[loop_name], trial.steps[end["step"]])
                self._collapse(loop, end)
            except (_Refuse, TemplateRewriteError) as e:
                err = e if isinstance(e, _Refuse) else _Refuse(str(e))
                self.refuse(err, "end-loop", loop, "loop", ("workflow", idx, "loop"))
                # the loop, its chain and its end step stay exactly as written
                self.frozen.update(id(st) for st in self._region(loop, end))

    def _collapse(self, L: CommentedMap, E: CommentedMap) -> None:
        """Fold the steps between loop step L and its end_loop step E into L's pipeline."""
        l_trailing, e_trailing = _take_trailing(L), _take_trailing(E)
        try:
            self._collapse_into(L, E)
        finally:
            _give_trailing(L, l_trailing)
            _give_trailing(E, e_trailing)

    def _post_loop_resolver(self, lname: str, body: set[str]) -> Resolver:
        def resolver(ref: NameRef) -> tuple[str, int] | None:
            if ref.name in body:
                return f"({lname}.results | last).{ref.name}", 0
            return None

        return resolver

    def _fold_end(self, E: CommentedMap, lname: str, post: Resolver) -> None:
        """The end_loop step: its `result` (keys may read earlier keys) becomes a noop task returning it."""
        res = E.get("result")
        keys_so_far: dict[str, str] = {}
        if isinstance(res, dict) and res:
            out = CommentedMap()
            for k, v in res.items():
                if isinstance(v, str):

                    def inline(ref: NameRef, _known: dict[str, str] = keys_so_far) -> tuple[str, int] | None:
                        if ref.name in _known:
                            return _group(_known[ref.name]), 0
                        return post(ref)

                    new = rewrite_template(v, inline)
                    out[k] = _restyle(v, new)
                    e = single_expression(new)
                    if e is not None:
                        keys_so_far[str(k)] = e
                else:
                    out[k] = v
            E.insert(_index(E, "result"), "tool", _cm(("kind", "noop"), ("result", out)))
            _pop(E, "result")
        elif "result" in E:
            _pop(E, "result", None)
        # E's own arcs read its result keys by bare name (v1 put them in the global context)
        if keys_so_far or isinstance(res, dict):
            rkeys = set(res.keys()) if isinstance(res, dict) else set()
            ename = E["step"]

            def own(ref: NameRef) -> tuple[str, int] | None:
                if ref.name in rkeys:
                    return f"{ename}.{ref.name}", 0
                return post(ref)

            if "next" in E:
                E["next"] = _rewrite_all(E["next"], own)
        _pop(E, "end_loop")

    def _reachable_from_entry(self) -> set[str]:
        wf = [s for s in self.doc["workflow"] if isinstance(s, dict)]
        if not wf:
            return set()
        entry = "start" if "start" in self.steps else wf[0].get("step")
        seen: set[str] = set()
        todo = [entry]
        while todo:
            n = todo.pop()
            if n in seen or n not in self.steps:
                continue
            seen.add(n)
            for g in self._legacy_groups(self.steps[n], quiet=True) or []:
                todo.extend(t.step for t in g.targets)
            nxt = self.steps[n].get("next")
            if isinstance(nxt, dict):
                todo.extend(a.get("step") for a in nxt.get("arcs") or [] if isinstance(a, dict))
            end = self.steps[n].get("loop")
            if end is not None:  # a v1 loop step continues at its end_loop step
                todo.extend(s["step"] for s in self.steps.values() if s.get("end_loop") == n)
        return seen
