"""BFCL multi-turn entries → task records (see the package docstring)."""

from __future__ import annotations

import ast
import copy
import functools
import importlib
import importlib.util
import inspect
import json
from pathlib import Path
from typing import Any
from toolkit.bfcl.env import env_source

CATEGORIES = ("multi_turn_base", "multi_turn_miss_func", "multi_turn_miss_param", "multi_turn_long_context")
# BFCL's own type map (bfcl_eval.constants.type_mappings.GORILLA_TO_OPENAPI), used when importable
_FALLBACK_TYPES = {"integer": "integer", "number": "number", "float": "number", "string": "string",
                   "boolean": "boolean", "bool": "boolean", "array": "array", "list": "array", "dict": "object",
                   "object": "object", "tuple": "array", "any": "string", "byte": "integer", "short": "integer",
                   "long": "integer", "double": "number", "char": "string"}
HELD_OUT_PROMPT = "I have updated some more functions you can choose from. What about now?"


class BfclUnavailable(RuntimeError):
    """bfcl-eval is not installed (the optional extra `bfcl`)."""


def available() -> bool:
    return importlib.util.find_spec("bfcl_eval") is not None


def _root() -> Path:
    spec = importlib.util.find_spec("bfcl_eval")
    if spec is None or not spec.submodule_search_locations:
        raise BfclUnavailable("bfcl-eval is not installed: pip install --no-deps bfcl-eval "
                              "(the toolkit's extra `bfcl`; --no-deps: its pins would downgrade numpy)")
    return Path(list(spec.submodule_search_locations)[0])


def _jsonl(p: Path) -> list[dict]:
    return [json.loads(ln) for ln in p.read_text(encoding="utf-8").splitlines() if ln.strip()]


@functools.lru_cache(maxsize=None)
def type_map() -> dict[str, str]:
    try:
        from bfcl_eval.constants.type_mappings import GORILLA_TO_OPENAPI

        return dict(GORILLA_TO_OPENAPI)
    except ImportError:
        return dict(_FALLBACK_TYPES)


@functools.lru_cache(maxsize=None)
def class_modules() -> dict[str, str]:
    from bfcl_eval.constants.executable_backend_config import CLASS_FILE_PATH_MAPPING

    return dict(CLASS_FILE_PATH_MAPPING)


@functools.lru_cache(maxsize=None)
def stateless_classes() -> tuple[str, ...]:
    from bfcl_eval.constants.executable_backend_config import STATELESS_CLASSES

    return tuple(STATELESS_CLASSES)


@functools.lru_cache(maxsize=None)
def func_docs(cls: str) -> list[dict]:
    from bfcl_eval.constants.executable_backend_config import (
        MULTI_TURN_FUNC_DOC_FILE_MAPPING,
    )

    return _jsonl(_root() / "data" / "multi_turn_func_doc" / MULTI_TURN_FUNC_DOC_FILE_MAPPING[cls])


def _cast(props: dict, mapping: dict) -> dict:
    """BFCL's `_cast_to_openai_type` (model_handler/utils.py), which cannot be imported without
    tree-sitter: unknown or missing types become "string", floats are noted in the description."""
    for key, value in props.items():
        t = value.get("type")
        if t is None:
            value["type"] = "string"
        else:
            if t == "float":
                value["format"] = "float"
                value["description"] = (value.get("description") or "") + " This is a float type value."
            value["type"] = mapping.get(t, "string")
        if value["type"] in ("array", "object"):
            if "properties" in value:
                value["properties"] = _cast(value["properties"], mapping)
            elif isinstance(value.get("items"), dict):
                it = value["items"]
                it["type"] = mapping.get(it.get("type"), "string")
                if it["type"] == "array" and isinstance(it.get("items"), dict):
                    it["items"]["type"] = mapping.get(it["items"].get("type"), "string")
                elif it["type"] == "object" and "properties" in it:
                    it["properties"] = _cast(it["properties"], mapping)
    return props


def openai_tools(docs: list[dict]) -> list[dict]:
    """BFCL function docs → OpenAI tool schemas, as BFCL's OpenAI handler converts them (dotted
    names get "_"); the `response` schema is dropped (it is no parameter)."""
    out = []
    mapping = type_map()
    for d in copy.deepcopy(docs):
        params = d.get("parameters") or {"type": "object", "properties": {}}
        params["type"] = "object"
        params["properties"] = _cast(params.get("properties") or {}, mapping)
        out.append({"type": "function", "function": {"name": d["name"].replace(".", "_"),
                                                     "description": d.get("description") or "",
                                                     "parameters": params}})
    return out


def load_entries(category: str) -> list[tuple[dict, list]]:
    """[(entry, ground truth per turn)] of `BFCL_v4_<category>.json` (category with or without the
    multi_turn_ prefix)."""
    cat = category if category.startswith("multi_turn_") else f"multi_turn_{category}"
    if cat not in CATEGORIES:
        raise ValueError(f"bfcl category {category!r}: choose from {', '.join(CATEGORIES)}")
    root = _root() / "data"
    entries = _jsonl(root / f"BFCL_v4_{cat}.json")
    answers = {a["id"]: a["ground_truth"] for a in _jsonl(root / "possible_answer" / f"BFCL_v4_{cat}.json")}
    return [(e, answers.get(e["id"], [])) for e in entries]


@functools.lru_cache(maxsize=None)
def _signature(cls: str, method: str) -> inspect.Signature:
    mod = importlib.import_module(class_modules()[cls])
    return inspect.signature(getattr(getattr(mod, cls), method))


def method_owner(classes: list[str]) -> dict[str, str]:
    """{public method name: class} over the involved classes (BFCL's own resolution: the later
    class wins a clash, as its executor's mapping does)."""
    out: dict[str, str] = {}
    for cls in classes:
        mod = importlib.import_module(class_modules()[cls])
        for name, _ in inspect.getmembers(getattr(mod, cls), predicate=inspect.isfunction):
            if not name.startswith("_"):
                out[name] = cls
    return out


def _literal(node: ast.AST) -> Any:
    v = ast.literal_eval(node)
    return _jsonable(v)


def _jsonable(v: Any) -> Any:
    if isinstance(v, tuple):
        return [_jsonable(x) for x in v]
    if isinstance(v, list):
        return [_jsonable(x) for x in v]
    if isinstance(v, dict):
        return {str(k): _jsonable(x) for k, x in v.items()}
    return v


def parse_call(text: str, owners: dict[str, str]) -> tuple[str, dict]:
    """A ground-truth call string (`mv(source='a', destination='b')`, `sort('f.pdf')`) → (name,
    keyword arguments), positional arguments bound by the method's signature."""
    node = ast.parse(text.strip(), mode="eval").body
    if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name):
        raise ValueError(f"not a function call: {text!r}")
    name = node.func.id
    if name not in owners:
        raise ValueError(f"{name!r} is no method of the involved classes")
    args = [_literal(a) for a in node.args]
    kwargs = {k.arg: _literal(k.value) for k in node.keywords if k.arg}
    if args:
        bound = _signature(owners[name], name).bind(None, *args, **kwargs)
        kwargs = {k: v for k, v in bound.arguments.items() if k != "self"}
    return name, kwargs


def call_string(name: str, args: dict) -> str:
    """A call as BFCL's executor takes it: `name(key=<python literal>, ...)`."""
    if not name.isidentifier():
        raise ValueError(f"not a function name: {name!r}")
    parts = []
    for k, v in (args or {}).items():
        if not str(k).isidentifier():
            raise ValueError(f"not an argument name: {k!r}")
        parts.append(f"{k}={v!r}")
    return f"{name}({', '.join(parts)})"


def task_records(category: str, limit: int | None = None) -> list[dict]:
    cat = category if category.startswith("multi_turn_") else f"multi_turn_{category}"
    out = []
    for entry, gt in load_entries(cat)[:limit]:
        classes = list(entry["involved_classes"])
        owners = method_owner(classes)
        docs = [d for c in classes for d in func_docs(c)]
        tools = openai_tools(docs)
        held = {str(k): list(v) for k, v in (entry.get("missed_function") or {}).items()}
        turns = []
        for i, q in enumerate(entry["question"]):
            if not q and str(i) in held:
                q = [{"role": "user", "content": HELD_OUT_PROMPT}]
            turns.append([{"role": m.get("role", "user"), "content": m.get("content") or ""} for m in q])
        gt_turns = [[dict(zip(("name", "arguments"), parse_call(c, owners))) for c in turn] for turn in gt]
        first = "\n".join(m["content"] for m in turns[0] if m["role"] == "user") if turns else ""
        out.append({
            "id": entry["id"], "flow": "bfcl", "tags": ["bfcl", cat],
            "env": {"backend": "python", "id": f"bfcl:{cat}",
                    "config": {"tools": tools, "source": env_source([t["function"]["name"] for t in tools]),
                               "error_values": True, "validate_types": False,  # BFCL's tools decide
                               "policy": "Tools of: " + ", ".join(classes)},
                    "state": {"bfcl": {"classes": classes, "initial_config": entry.get("initial_config") or {},
                                       "long_context": "long_context" in cat, "history": []}}},
            "task": {"instruction": first, "user_turns": turns, "held_out_tools": held,
                     "ground_truth": {"actions": [a for t in gt_turns for a in t], "turns": gt_turns}},
            "extra": {"bfcl": {"id": entry["id"], "category": cat, "ground_truth": gt,
                               "involved_classes": classes, "path": entry.get("path")}},
        })
    return out
