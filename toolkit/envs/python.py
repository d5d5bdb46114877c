"""The python backend: ASTRA-style code environments whose tools are generated Python functions.

Every tool call runs ONLY inside the sandbox (`toolkit.sandbox.run_function`): the environment
holds the state (a JSON dict), ships `(tool name, state, arguments)` to a fresh sandboxed process
together with the tool source, and takes back `(result, new_state)`.

Env ref (a record's `env` field)::

    {"backend": "python",
     "path": "<dir or .json file>",          # optional
     "config": {"tools": [<OpenAI function schema>, ...],
                "source": "<python: one function per tool>",
                "policy": "...",
                "user_tools": [...],          # optional, dual-control user side
                "limits": {"wall_seconds": 5, "cpu_seconds": 5, "memory_mb": 512},  # optional: may
                                              # only narrow the operator's (docs/sandbox.md)
                "sandbox": "auto",            # ignored: the operator picks the backend
                "error_values": false,        # true: a returned {"error": ...} is a failed step
                "validate_types": true},      # false: only required / unknown argument names are
                                              # checked before the call (BFCL: the tool decides)
     "state": {<initial state>}}

A directory `path` holds tools.json, tools.py, policy.md, state.json (and optionally
user_tools.json, config.json); a .json `path` holds the config keys (+ "state") in one file.
Explicit `config` keys override the path's, an explicit `state` overrides state.json.

Tool functions take `(state: dict, **arguments)` and return `(result, new_state)`; returning a
bare result keeps the (possibly mutated in place) state. Raising an exception is a tool error:
`ToolResult.fail(code, message, violated_rule, hint)` where code is the exception's `code`
attribute if it has one, "POLICY_VIOLATION" for classes named PolicyViolation*, the exception class
name for user-defined exceptions, or "TOOL_ERROR" for built-in exceptions; `hint` and
`violated_rule` attributes are passed through. With `error_values: true` (BFCL's style) a tool that
returns a dict with an "error" key has failed too (code TOOL_ERROR, the error as the message),
counted like a raised error. Other codes: UNKNOWN_TOOL, INVALID_ARGUMENTS,
TIMEOUT (wall/CPU limit), RESOURCE_LIMIT (memory/file size), SANDBOX_ERROR. A failed call never
changes the state.
"""

from __future__ import annotations

import asyncio
import copy
import json
import threading
from pathlib import Path
from typing import Any

from toolkit.envs.base import BackendCapabilities, Environment, ToolResult, register_backend
from toolkit.sandbox import SandboxLimits, SandboxResult, limits_for_data, run_function
from toolkit.io import note_for_provenance

__all__ = ["PythonEnvironment", "PythonEnvError", "validate_arguments"]

_DISPATCH_FUNC = "__toolkit_dispatch__"
_DISPATCH_SRC = '''

def __toolkit_dispatch__(__tk_name, __tk_state, __tk_args):
    import json as __tk_json
    __tk_fn = globals().get(__tk_name)
    if __tk_fn is None or not callable(__tk_fn):
        return {"error": {"code": "UNKNOWN_TOOL", "type": "NameError",
                          "message": "tool %r is declared but its source defines no such function"
                                     % (__tk_name,)}}
    try:
        __tk_ret = __tk_fn(__tk_state, **__tk_args)
    except Exception as __tk_e:
        __tk_t = type(__tk_e)
        def __tk_attr(n):
            v = getattr(__tk_e, n, None)
            return v if isinstance(v, str) else None
        try:
            __tk_msg = str(__tk_e)
        except Exception:
            __tk_msg = ""
        if isinstance(__tk_e, KeyError) and __tk_e.args:
            __tk_msg = "key not found: %r" % (__tk_e.args[0],)
        return {"error": {"type": __tk_t.__name__, "builtin": __tk_t.__module__ == "builtins",
                          "message": __tk_msg, "code": __tk_attr("code"),
                          "hint": __tk_attr("hint"), "violated_rule": __tk_attr("violated_rule")}}
    if isinstance(__tk_ret, tuple) and len(__tk_ret) == 2 and isinstance(__tk_ret[1], dict):
        __tk_result, __tk_new = __tk_ret
    else:
        __tk_result, __tk_new = __tk_ret, __tk_state
    try:
        __tk_json.dumps(__tk_new)
    except (TypeError, ValueError) as __tk_e:
        return {"error": {"code": "TOOL_ERROR", "type": "TypeError",
                          "message": "tool %r returned a state that is not JSON-serializable: %s"
                                     % (__tk_name, __tk_e)}}
    try:
        __tk_json.dumps(__tk_result)
    except (TypeError, ValueError):
        __tk_result = __tk_json.loads(__tk_json.dumps(__tk_result, default=str))
    return {"result": __tk_result, "state": __tk_new}
'''

_JSON_TYPES: dict[str, tuple] = {
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "array": (list, tuple),
    "object": (dict,),
    "null": (type(None),),
}


class PythonEnvError(ValueError):
    """A python environment that cannot be loaded (bad files, bad source, bad schema)."""


def _normalize_tool(t: dict) -> dict:
    if not isinstance(t, dict):
        raise PythonEnvError(f"tool schema must be an object, got {type(t).__name__}")
    if t.get("type") == "function" and isinstance(t.get("function"), dict):
        fn = t["function"]
    elif "name" in t:
        fn = t
    else:
        raise PythonEnvError(f"not an OpenAI function schema: {json.dumps(t)[:200]}")
    if not isinstance(fn.get("name"), str) or not fn["name"].isidentifier():
        raise PythonEnvError(f"tool name must be a Python identifier: {fn.get('name')!r}")
    fn = dict(fn)
    fn.setdefault("description", "")
    fn.setdefault("parameters", {"type": "object", "properties": {}})
    return {"type": "function", "function": fn}


def _type_ok(value: Any, types: Any) -> bool:
    if isinstance(types, str):
        types = [types]
    if not isinstance(types, list):
        return True
    for t in types:
        py = _JSON_TYPES.get(t)
        if py is None:
            return True  # unknown type keyword: do not reject
        if t in ("integer", "number") and isinstance(value, bool):
            continue
        if t == "integer" and isinstance(value, float) and value.is_integer():
            return True
        if isinstance(value, py):
            return True
    return False


def validate_arguments(schema: dict, args: Any, types: bool = True) -> str | None:
    """Check `args` against a tool's JSON-schema parameters. Returns an error message or None.

    Checks: object-ness, required params, unknown params (unless additionalProperties is true),
    declared types and enums of top-level properties.
    """
    if not isinstance(args, dict):
        return f"arguments must be a JSON object, got {type(args).__name__}"
    params = schema or {}
    props = params.get("properties") or {}
    required = [r for r in (params.get("required") or []) if isinstance(r, str)]
    missing = [r for r in required if r not in args]
    if missing:
        return f"missing required argument(s): {', '.join(missing)}"
    if props and not params.get("additionalProperties", False):
        unknown = sorted(k for k in args if k not in props)
        if unknown:
            return (f"unknown argument(s): {', '.join(unknown)}; expected: "
                    f"{', '.join(sorted(props))}")
    for k, v in args.items() if types else ():
        spec = props.get(k)
        if not isinstance(spec, dict):
            continue
        if "type" in spec and not _type_ok(v, spec["type"]):
            return f"argument {k!r} must be of type {spec['type']}, got {type(v).__name__}"
        if "enum" in spec and isinstance(spec["enum"], list) and v not in spec["enum"]:
            return f"argument {k!r} must be one of {spec['enum']}, got {v!r}"
    return None


def _read_json(p: Path) -> Any:
    try:
        return json.loads(p.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise PythonEnvError(f"cannot read {p}: {e}") from e


def _load_path(path: str | Path) -> dict:
    p = Path(path)
    out: dict = {}
    if p.is_dir():
        if (p / "config.json").exists():
            cfg = _read_json(p / "config.json")
            if isinstance(cfg, dict):
                out.update(cfg)
        if (p / "tools.json").exists():
            tools = _read_json(p / "tools.json")
            out["tools"] = tools.get("tools", []) if isinstance(tools, dict) else tools
        if (p / "user_tools.json").exists():
            ut = _read_json(p / "user_tools.json")
            out["user_tools"] = ut.get("tools", []) if isinstance(ut, dict) else ut
        if (p / "tools.py").exists():
            out["source"] = (p / "tools.py").read_text(encoding="utf-8")
        if (p / "policy.md").exists():
            out["policy"] = (p / "policy.md").read_text(encoding="utf-8")
        if (p / "state.json").exists():
            out["state"] = _read_json(p / "state.json")
        return out
    if p.is_file():
        data = _read_json(p)
        if not isinstance(data, dict):
            raise PythonEnvError(f"{p}: expected a JSON object")
        out.update(data.get("config") if isinstance(data.get("config"), dict) else {})
        out.update({k: v for k, v in data.items() if k != "config"})
        if "source" not in out and isinstance(out.get("source_file"), str):
            out["source"] = (p.parent / out["source_file"]).read_text(encoding="utf-8")
        return out
    raise PythonEnvError(f"python env path not found: {path}")


def _data_backend(asked: Any) -> str:
    """The backend a record's env.config asked for: the operator's (`auto`) either way, since data
    must not pick a weaker isolation than the operator's (--sandbox / --sandbox-isolation)."""
    if asked not in (None, "auto"):
        note_for_provenance("sandbox_clamped", f"sandbox: {str(asked)[:40]!r} ignored; the operator's backend applies")
    return "auto"


class PythonEnvironment(Environment):
    backend = "python"

    def __init__(self, tools: list[dict], source: str, policy: str = "",
                 state: dict | None = None, user_tools: list[dict] | None = None,
                 limits: SandboxLimits | dict | None = None, sandbox: str = "auto",
                 error_values: bool = False, validate_types: bool = True) -> None:
        self.error_values = bool(error_values)
        self.validate_types = bool(validate_types)
        self._tools = [_normalize_tool(t) for t in (tools or [])]
        self._user_tools = [_normalize_tool(t) for t in (user_tools or [])]
        self._source = source or ""
        try:  # syntax check on the host: compiling does not execute anything
            compile(self._source, "<tools.py>", "exec")
        except SyntaxError as e:
            raise PythonEnvError(f"tool source does not compile: {e}") from e
        self._policy = policy or ""
        if state is None:
            state = {}
        if not isinstance(state, dict):
            raise PythonEnvError("the initial state must be a JSON object")
        try:
            self._initial = json.loads(json.dumps(state))
        except (TypeError, ValueError) as e:
            raise PythonEnvError(f"the initial state is not JSON: {e}") from e
        self._state = copy.deepcopy(self._initial)
        # limits come from the operator (toolkit.sandbox.operator_limits: --sandbox-limits, recipe
        # `sandbox_limits`, TOOLKIT_SANDBOX_LIMITS); a mapping is data (a record's env.config) and
        # may only narrow them: wider or invalid values are clamped, noted in self.limit_notes and
        # in the record's provenance (sandbox_clamped). A SandboxLimits object is operator code's.
        self.limits, self.limit_notes = limits_for_data(limits, "python")
        self.sandbox = sandbox or "auto"
        self._lock = threading.Lock()
        self._program = self._source + _DISPATCH_SRC
        self.last_result: SandboxResult | None = None

    # -- construction
    @classmethod
    def from_ref(cls, ref: dict) -> "PythonEnvironment":
        if hasattr(ref, "model_dump"):
            ref = ref.model_dump(exclude_none=True)
        ref = dict(ref or {})
        data: dict = {}
        if ref.get("path"):
            data.update(_load_path(ref["path"]))
        cfg = ref.get("config") or {}
        if not isinstance(cfg, dict):
            raise PythonEnvError("env.config must be an object")
        data.update(cfg)
        if ref.get("state") is not None:
            data["state"] = ref["state"]
        if not data.get("tools"):
            raise PythonEnvError("python env has no tools (config.tools or tools.json)")
        if not data.get("source"):
            raise PythonEnvError("python env has no tool source (config.source or tools.py)")
        return cls(tools=data["tools"], source=data["source"], policy=data.get("policy", ""),
                   state=data.get("state"), user_tools=data.get("user_tools"),
                   limits=data.get("limits"), sandbox=_data_backend(data.get("sandbox")),
                   error_values=data.get("error_values") is True,
                   validate_types=data.get("validate_types") is not False)

    # -- protocol
    def tools(self, side: str = "agent") -> list[dict]:
        return copy.deepcopy(self._user_tools if side == "user" else self._tools)

    def policy(self) -> str:
        return self._policy

    def reset(self, state: dict | None = None) -> None:
        with self._lock:
            self._state = copy.deepcopy(self._initial if state is None else
                                        json.loads(json.dumps(state)))

    def snapshot(self) -> dict:
        with self._lock:
            return copy.deepcopy(self._state)

    def _schema(self, name: str, side: str) -> dict | None:
        for t in (self._user_tools if side == "user" else self._tools):
            if t["function"]["name"] == name:
                return t["function"]
        return None

    def call(self, name: str, args: dict, side: str = "agent") -> ToolResult:
        fn = self._schema(name, side)
        if fn is None:
            known = sorted(t["function"]["name"] for t in
                           (self._user_tools if side == "user" else self._tools))
            return ToolResult.fail("UNKNOWN_TOOL", f"unknown tool {name!r}",
                                   hint=f"available tools: {', '.join(known)}")
        if isinstance(args, str):
            try:
                args = json.loads(args) if args.strip() else {}
            except ValueError as e:
                return ToolResult.fail("INVALID_ARGUMENTS", f"arguments are not valid JSON: {e}")
        if args is None:
            args = {}
        problem = validate_arguments(fn.get("parameters") or {}, args, types=self.validate_types)
        if problem:
            return ToolResult.fail("INVALID_ARGUMENTS", f"{name}: {problem}",
                                   hint="check the tool's parameter schema")
        try:
            json.dumps(args)
        except (TypeError, ValueError) as e:
            return ToolResult.fail("INVALID_ARGUMENTS", f"arguments are not JSON: {e}")
        with self._lock:
            res = run_function(self._program, _DISPATCH_FUNC, args=[name, self._state, args],
                               limits=self.limits, backend=self.sandbox)
            self.last_result = res
            if not res.ok:
                return self._sandbox_failure(name, res)
            out = res.value if isinstance(res.value, dict) else {}
            if "error" in out:
                return self._tool_error(out["error"] or {})
            result = out.get("result")
            if self.error_values and isinstance(result, dict) and "error" in result:
                err = result["error"]
                return ToolResult.fail("TOOL_ERROR", err if isinstance(err, str) else
                                       json.dumps(err, ensure_ascii=False, default=str))
            new_state = out.get("state")
            if not isinstance(new_state, dict):
                return ToolResult.fail("TOOL_ERROR", f"tool {name!r} returned a state that is "
                                       "not an object; state unchanged")
            self._state = new_state
            return ToolResult.success(result)

    async def acall(self, name: str, args: dict, side: str = "agent") -> ToolResult:
        return await asyncio.to_thread(self.call, name, args, side)

    # -- error mapping
    @staticmethod
    def _tool_error(err: dict) -> ToolResult:
        etype = err.get("type") or "Exception"
        msg = err.get("message") or ""
        code = err.get("code")
        if not code:
            if etype.startswith("PolicyViolation"):
                code = "POLICY_VIOLATION"
            elif err.get("builtin", True):
                code = "TOOL_ERROR"
            else:
                code = etype
        if err.get("builtin") and etype not in ("Exception",):
            msg = f"{etype}: {msg}" if msg else etype
        return ToolResult.fail(code, msg or etype, violated_rule=err.get("violated_rule"),
                               hint=err.get("hint"))

    def _sandbox_failure(self, name: str, res: SandboxResult) -> ToolResult:
        first = (res.error or "sandbox failure").splitlines()[0]
        if res.killed in ("wall_timeout", "cpu_limit"):
            return ToolResult.fail("TIMEOUT", f"tool {name!r} did not finish: {first}",
                                   hint="the call was killed; the state is unchanged")
        if res.killed == "memory" or res.killed == "SIGXFSZ":
            return ToolResult.fail("RESOURCE_LIMIT", f"tool {name!r} exceeded a resource limit: "
                                   f"{first}", hint="the call was killed; the state is unchanged")
        if res.error_type and res.error_type != "SandboxError":
            # the tool module itself failed at import (e.g. NameError at top level)
            return ToolResult.fail("TOOL_ERROR", f"tool {name!r} failed: {first}")
        return ToolResult.fail("SANDBOX_ERROR", f"tool {name!r}: {first}")


register_backend("python", PythonEnvironment.from_ref,
                 doc="ASTRA-style code environment: generated Python tools run in the sandbox",
                 capabilities=BackendCapabilities(policy_errors=True, code_tools=True))
