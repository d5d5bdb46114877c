"""The BFCL python environment's tool source (standard library + bfcl_eval only): shipped as text
to the sandbox with one stub per tool (`env.env_source`), importable here for tests and the
checker. State: {"bfcl": {classes, initial_config, long_context, history}, <class>: [{attr, value}]}:
each call rebuilds the classes from the initial config (as BFCL's executor does), replays the
calls so far, runs the new one and appends it to the history; the per-class tables are the
instances' public attributes after it (what BFCL's state checker compares)."""

BFCL_PREFIX = "bfcl_eval.eval_checker.multi_turn_eval.func_source_code."
BFCL_MODULES = {"GorillaFileSystem": "gorilla_file_system", "MathAPI": "math_api", "MessageAPI": "message_api",
                "TwitterAPI": "posting_api", "TicketAPI": "ticket_api", "TradingBot": "trading_bot",
                "TravelAPI": "travel_booking", "VehicleControlAPI": "vehicle_control"}
BFCL_STATELESS = ("MathAPI",)


def _bfcl_build(scenario):
    import copy
    import importlib

    inst = {}
    for cls in scenario["classes"]:
        mod = importlib.import_module(BFCL_PREFIX + BFCL_MODULES[cls])
        obj = getattr(mod, cls)()
        if cls not in BFCL_STATELESS:
            obj._load_scenario(copy.deepcopy((scenario.get("initial_config") or {}).get(cls, {})),
                               long_context=bool(scenario.get("long_context")))
        inst[cls] = obj
    return inst


def _bfcl_owner(inst, name):
    owner = None
    if name.startswith("_"):
        return None
    for obj in inst.values():  # a later class wins a name clash, as in BFCL's executor
        if callable(getattr(obj, name, None)):
            owner = obj
    return owner


def _bfcl_ser(v, path=()):
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    if id(v) in path:
        return "<cycle>"
    path = path + (id(v),)
    if isinstance(v, dict):
        return {str(k): _bfcl_ser(x, path) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_bfcl_ser(x, path) for x in v]
    if isinstance(v, (set, frozenset)):
        return sorted((_bfcl_ser(x, path) for x in v), key=repr)
    d = getattr(v, "__dict__", None)
    if isinstance(d, dict):
        out = {"__class__": type(v).__name__}
        for k, x in d.items():
            if k.startswith("_") or k == "parent":
                continue
            out[k] = _bfcl_ser(x, path)
        return out
    return str(v)


def bfcl_dump(inst):
    """{class: [{"attr", "value"}]}: the public attributes of each instance, JSON-able."""
    out = {}
    for cls, obj in inst.items():
        out[cls] = [{"attr": k, "value": _bfcl_ser(x)} for k, x in sorted(vars(obj).items())
                    if not k.startswith("_")]
    return out


def _bfcl_run(state, name, args):
    scenario = state["bfcl"]
    inst = _bfcl_build(scenario)
    for n, a in scenario.get("history") or []:
        o = _bfcl_owner(inst, n)
        try:
            getattr(o, n)(**a)
        except Exception:  # it failed when it ran too; the state it left is what it left
            pass
    o = _bfcl_owner(inst, name)
    if o is None:
        raise NameError("no involved class has a method %r" % (name,))
    result = getattr(o, name)(**args)
    new = dict(bfcl_dump(inst))
    new["bfcl"] = dict(scenario, history=list(scenario.get("history") or []) + [[name, args]])
    return result, new
