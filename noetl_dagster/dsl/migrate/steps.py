"""Step-level tool rules: v1 ``type`` + inline tool keys -> ``tool``, v1 ``type: iterator`` -> ``loop``,
``args`` / ``with`` -> ``input``, step ``when`` -> an admit policy, the task-body fixes (``set_vars``,
``eval``, task ``args``), and python ``main()`` parameters fed by arcs."""

from __future__ import annotations

from ruamel.yaml.comments import CommentedMap, CommentedSeq

from .base import MigratorBase
from .constants import ARGS_NATIVE_KINDS, KIND_ALIASES, ROUTING_ONLY_TYPES, V1_STEP_KEYS
from .pieces import _bind_main_params, _task_items
from .report import _Refuse
from .yamltree import _cm, _dq, _flow, _give_trailing, _index, _pop, _rename_key, _take_trailing


class StepMixin(MigratorBase):
    """Rules that turn a legacy step's tool spelling into ``tool:`` and its inputs into ``input:``."""

    # v1: type / task / with / inline config -> tool
    def _v1_tool(self, s: CommentedMap, path: tuple) -> None:
        """v1 `type` / `task` / `with` (and early-v2 `tool: <kind>`) with the tool's keys on the step -> `tool`."""
        tool_name = s.get("tool") if isinstance(s.get("tool"), str) else None
        if "type" not in s and tool_name is None and not ("task" in s and "tool" not in s):
            return
        anchor = "type" if "type" in s else "tool" if tool_name is not None else "task"
        t = tool_name if tool_name is not None else s.get("type")
        try:
            if "tool" in s and tool_name is None:
                raise _Refuse("the step has both `type` and `tool`", s, "type")
            if tool_name is not None and "type" in s:
                raise _Refuse("the step has both `type` and `tool`", s, "type")
            if "pass" in s or "call" in s:
                raise _Refuse(
                    "`pass` / `call` steps have no standard counterpart", s, "pass" if "pass" in s else "call"
                )
            kind = "workbook" if t in (None, "workbook") else str(t)
            if kind == "iterator":
                self._v1_iterator(s, path)
                return
            config_keys = [k for k in s if k not in V1_STEP_KEYS and not (kind == "workbook" and k == "name")]
            if kind in ROUTING_ONLY_TYPES:
                if config_keys:
                    raise _Refuse(f"a `type: {kind}` step has tool keys {config_keys}", s, anchor)
                _pop(s, anchor)
                return
            if isinstance(s.get("with"), dict) and kind != "workbook" and "input" in config_keys:
                raise _Refuse("the step has both `with` and an `input` key", s, "with")
        except _Refuse as e:
            self.refuse(e, "step-type", s, anchor, (*path, anchor))
            return
        kind = KIND_ALIASES.get(kind, kind)
        if "data" in config_keys and kind != "http" and isinstance(s.get("data"), dict) and "with" not in s:
            _rename_key(
                s, "data", "with"
            )  # v1 `data:` on a step is its input (http keeps `data` as its body)
            config_keys = [k for k in config_keys if k != "data"]
        tool = CommentedMap()
        tool["kind"] = kind
        if kind == "workbook":
            tool["name"] = s.get("task") or s.get("name")
        for k in config_keys:
            _pop(s, k, tool)
        pos = _index(s, anchor)
        for k in ("type", "task", "tool") + (("name",) if kind == "workbook" else ()):
            if k in s and (k != "tool" or tool_name is not None):
                if k != anchor:
                    s.ca.items.pop(k, None)
                s.pop(k)
        s.insert(pos, "tool", tool)
        if isinstance(s.get("with"), dict):
            try:
                self._merge_input(tool, s, "with", path)
            except _Refuse as e:  # unreachable after the check above; kept so a refusal is never a crash
                self.refuse(e, "step-type", s, "with", (*path, "with"))

    def _v1_iterator(self, s: CommentedMap, path: tuple) -> None:
        """v1 `type: iterator` (collection, element, mode, task) -> a `loop:` step whose tool is the task."""
        try:
            task = s.get("task")
            if not isinstance(task, dict) or "collection" not in s or "element" not in s:
                raise _Refuse(
                    "an iterator step needs `collection`, `element` and a `task` mapping", s, "type"
                )
            if "loop" in s:
                raise _Refuse("an iterator step that also has `loop`", s, "loop")
            extra = [
                k
                for k in s
                if k not in V1_STEP_KEYS and k not in ("collection", "element", "mode", "concurrency")
            ]
            if extra:
                raise _Refuse(f"iterator keys {extra} have no counterpart", s, extra[0])
            tkind = task.get("kind", task.get("type"))
            if not isinstance(tkind, str):
                raise _Refuse("the iterator's task has no `type`", s, "task")
            if "save" in task and "save" in s:
                raise _Refuse("both the iterator and its task have `save`", s, "save")
        except _Refuse as e:
            self.refuse(e, "iterator", s, "type", (*path, "type"))
            return
        loop = CommentedMap()
        loop["in"] = s["collection"]
        loop["iterator"] = s["element"]
        spec = CommentedMap()
        if "mode" in s:
            spec["mode"] = s["mode"]
        if "concurrency" in s:
            spec["max_in_flight"] = s["concurrency"]
        if spec:
            loop["spec"] = spec
        pos = _index(s, "type")
        tool = CommentedMap()
        tool["kind"] = KIND_ALIASES.get(tkind, tkind)
        for k in list(task.keys()):
            if k in ("type", "kind"):
                continue
            if k == "save":
                _pop(task, k, s)  # per-iteration storage: a task of the loop's pipeline
            elif k in ("data", "with", "args") and isinstance(task[k], dict) and "input" not in tool:
                _pop(task, k, tool, "input")
            else:
                _pop(task, k, tool)
        for k in ("type", "collection", "element", "mode", "concurrency", "task"):
            if k in s:
                _pop(s, k)
        s.insert(pos, "loop", loop)
        s.insert(pos + 1, "tool", tool)
        self._task_body(tool, (*path, "tool"), s)

    def _merge_input(self, tool: CommentedMap, src: CommentedMap, key: str, path: tuple) -> None:
        """Move ``src[key]`` (a legacy `with` / `args` mapping) into ``tool.input``."""
        val = src[key]
        if "input" not in tool:
            if src is tool:
                _rename_key(tool, key, "input")
            else:
                _pop(src, key, tool, "input")
            return
        if not isinstance(tool["input"], dict):
            raise _Refuse("`input` is not a mapping", src, key)
        clash = sorted(set(val) & set(tool["input"]))
        if clash:
            raise _Refuse(f"`{key}` and `input` both set {clash}", src, key)
        for k in list(val.keys()):
            _pop(val, k, tool["input"])
        _pop(src, key)

    def _step_input(self, s: CommentedMap, key: str, path: tuple) -> None:
        """Step-level `args` / `with` -> the step's `input` (merged into every task's input)."""
        try:
            if key == "with" and isinstance(s.get("tool"), dict) and "kind" in s["tool"]:
                self._merge_input(s["tool"], s, key, path)
            elif "input" in s:
                if not isinstance(s["input"], dict) or set(s[key]) & set(s["input"]):
                    raise _Refuse(f"step `{key}` and `input` overlap", s, key)
                for k in list(s[key].keys()):
                    _pop(s[key], k, s["input"])
                _pop(s, key)
            else:
                _rename_key(s, key, "input")
        except _Refuse as e:
            self.refuse(e, "step-input", s, key, (*path, key))

    # step.when -> admission rules
    def _step_when(self, s: CommentedMap, path: tuple) -> None:
        if "when" not in s:
            return
        spec = s.get("spec")
        if spec is not None and (not isinstance(spec, dict) or isinstance((spec.get("policy") or {}), dict)
                                 and "admit" in (spec.get("policy") or {})):  # fmt: skip
            self.note(
                "refused", "step-when", "the step already has admission rules", s, "when", (*path, "when")
            )
            return
        cond = s["when"]
        rules = CommentedSeq([
            _cm(("when", _dq(cond)), ("then", _flow(_cm(allow=True)))),
            _cm(("else", _cm(("then", _flow(_cm(allow=False)))))),
        ])  # fmt: skip
        if spec is None:
            spec = CommentedMap()
            s.insert(_index(s, "when"), "spec", spec)
        policy = spec.setdefault("policy", CommentedMap())
        policy["admit"] = _cm(("rules", rules))
        _pop(s, "when")
        self.note("info", "step-when", "step `when` became `spec.policy.admit.rules`: a refused token ends its "
                  "branch (it no longer follows the step's arcs)", s, "spec", (*path, "spec"))  # fmt: skip

    # task-level fixes: type -> kind, args/with -> input, retry, eval, set_vars
    def _task_body(self, body: CommentedMap, path: tuple, step: CommentedMap | None) -> None:
        trailing = _take_trailing(body)
        try:
            self._task_body_fix(body, path, step)
        finally:
            _give_trailing(body, trailing)

    def _task_body_fix(self, body: CommentedMap, path: tuple, step: CommentedMap | None) -> None:
        if "kind" not in body and "type" in body:
            _rename_key(body, "type", "kind")
            body["kind"] = KIND_ALIASES.get(str(body["kind"]), body["kind"])
        kind = body.get("kind")
        for key in ("with", "args"):
            if isinstance(body.get(key), dict) and not (key == "args" and kind in ARGS_NATIVE_KINDS):
                try:
                    self._merge_input(body, body, key, path)
                except _Refuse as e:
                    self.refuse(e, "task-input", body, key, (*path, key))
        if isinstance(body.get("retry"), dict):
            try:
                rule = self._retry_rule(body["retry"], str(kind), step.get("step") if step else None)
                self._add_rules(body, [rule], body, "retry")
                _pop(body, "retry")
            except _Refuse as e:
                self.refuse(e, "retry", body, "retry", (*path, "retry"))
        if "eval" in body:
            try:
                rules = self._eval_rules(body["eval"], body)
                self._add_rules(body, rules, body, "eval")
                _pop(body, "eval")
            except _Refuse as e:
                self.refuse(e, "eval", body, "eval", (*path, "eval"))
        for key in ("sink", "save"):
            if isinstance(body.get(key), dict):
                self.note("refused", "task-sink", f"a task-level `{key}` is not translated; move it to the step",
                          body, key, (*path, key))  # fmt: skip
        rules = (
            ((body.get("spec") or {}).get("policy") or {}).get("rules")
            if isinstance(body.get("spec"), dict)
            else None
        )
        for r in rules if isinstance(rules, list) else []:
            if not isinstance(r, dict):
                continue
            if "expr" in r and "when" not in r:
                _rename_key(r, "expr", "when")
            for holder in (r.get("then"), (r.get("else") or {}).get("then") if isinstance(r.get("else"), dict) else None,
                           r.get("else")):  # fmt: skip
                if isinstance(holder, dict) and "set_vars" in holder and "set_ctx" not in holder:
                    _rename_key(holder, "set_vars", "set_ctx")

    # -- python main() parameters fed by arcs ---------------------------------------
    def _passthrough_inputs(self, s: CommentedMap, path: tuple) -> None:
        """v1 bound `main(...)` parameters from values routed in with `with`; make them inputs."""
        incoming = self.incoming.get(s["step"], set())
        for t in _task_items(s.get("tool")) or [] if incoming else []:
            _bind_main_params(t.body, incoming)
