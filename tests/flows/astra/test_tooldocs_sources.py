"""ASTRA A1 on hand-written documents of the kinds real APIs ship: an OpenAPI 3 document with a
form-urlencoded body (USPTO's data-set API), allOf / oneOf bodies, recursive request and response
schemas, an MCP tools/list with dotted and slashed names. Every operation with a mappable input
imports; each drop and each rewrite has its line."""

import json

import pytest

from tests.conftest import run_cmd
from toolkit.flows.astra import tooldocs as T

# Shaped after USPTO's Data Set API (developer.uspto.gov/ds-api): 3 operations, the search takes a
# form-urlencoded body. Written by hand for this test.
USPTO_YAML = """\
openapi: 3.0.1
info:
  title: USPTO Data Set API
  description: The Data Set API (DSAPI) allows the public users to discover and search USPTO exported data sets.
  version: 1.0.0
servers:
  - url: '{scheme}://developer.uspto.gov/ds-api'
paths:
  /:
    get:
      tags: [metadata]
      operationId: list-data-sets
      summary: List available data sets
      responses:
        '200':
          description: Returns a list of data sets
          content:
            application/json:
              schema:
                $ref: '#/components/schemas/dataSetList'
  /{dataset}/{version}/fields:
    get:
      tags: [metadata]
      summary: Provides the general information about the API and the list of fields that can be used to query the dataset.
      operationId: list-searchable-fields
      parameters:
        - name: dataset
          in: path
          description: 'Name of the dataset.'
          required: true
          example: oa_citations
          schema:
            type: string
        - name: version
          in: path
          description: Version of the dataset.
          required: true
          schema:
            type: string
      responses:
        '200':
          description: The dataset API for the given version is found and it is accessible to consume.
          content:
            application/json:
              schema:
                type: string
  /{dataset}/{version}/records:
    post:
      tags: [search]
      summary: Provides search capability for the data set with the given search criteria.
      description: This API is based on Solr/Lucene Search. The data is indexed using SOLR.
      operationId: perform-search
      parameters:
        - name: version
          in: path
          description: Version of the dataset.
          required: true
          schema:
            type: string
            default: v1
        - name: dataset
          in: path
          description: 'Name of the dataset. In this case, the default value is oa_citations'
          required: true
          schema:
            type: string
            default: oa_citations
      responses:
        '200':
          description: successful operation
          content:
            application/json:
              schema:
                type: array
                items:
                  type: object
                  additionalProperties:
                    type: object
        '404':
          description: No matching record found for the given criteria.
      requestBody:
        content:
          application/x-www-form-urlencoded:
            schema:
              type: object
              properties:
                criteria:
                  description: 'Uses Lucene Query Syntax in the format of propertyName:value.'
                  type: string
                  default: '*:*'
                start:
                  description: Starting record number. Default value is 0.
                  type: integer
                  default: 0
                rows:
                  description: 'Specify number of rows to be returned.'
                  type: integer
                  default: 100
              required:
                - criteria
components:
  schemas:
    dataSetList:
      type: object
      properties:
        total:
          type: integer
        apis:
          type: array
          items:
            type: object
            properties:
              apiKey:
                type: string
                description: To be used as a dataset parameter value
              apiVersionNumber:
                type: string
              apiUrl:
                type: string
                format: uriref
"""


def test_uspto_form_body_imports_every_operation(tmp_path):
    p = tmp_path / "uspto.yaml"
    p.write_text(USPTO_YAML)
    res = T.import_paths([str(p)])
    assert res.drops == [], [d.line() for d in res.drops]
    (s,) = res.servers
    assert s.name == "USPTO Data Set API" and s.source == "openapi"
    by = {t["function"]["name"]: t["function"] for t in s.tools}
    # operationIds with '-' are already valid OpenAI names: kept as they are
    assert list(by) == ["list-data-sets", "list-searchable-fields", "perform-search"]
    search = by["perform-search"]["parameters"]
    assert list(search["properties"]) == ["version", "dataset", "criteria", "start", "rows"]
    assert search["required"] == ["version", "dataset", "criteria"]
    assert search["properties"]["rows"] == {"description": "Specify number of rows to be returned.",
                                            "type": "integer", "default": 100}
    assert by["list-data-sets"]["parameters"] == {"type": "object", "properties": {}}
    assert s.outputs["list-data-sets"][:3] == ["total", "apis", "apiKey"]
    for t in s.tools:
        assert T.validate_openai_tool(t) == []
    # the CLI: exit 0, one server line
    r = run_cmd(["toolkit", "tools", "import", str(p)])
    assert r.returncode == 0, r.stderr
    assert [json.loads(x)["id"] for x in r.stdout.splitlines()] == ["server-USPTO-Data-Set-API"]


def _api(paths: dict, schemas: dict) -> dict:
    return {"openapi": "3.1.0", "info": {"title": "shop"}, "components": {"schemas": schemas}, "paths": paths}


def _post(op_id: str, summary: str, schema: dict, response: dict | None = None,
          media: str = "application/json") -> dict:
    op = {"operationId": op_id, "summary": summary,
          "requestBody": {"required": True, "content": {media: {"schema": schema}}}}
    if response is not None:
        op["responses"] = {"200": {"description": "ok", "content": {"application/json": {"schema": response}}}}
    return {"post": op}


SCHEMAS = {
    "Base": {"type": "object", "properties": {"name": {"type": "string", "description": "Display name."},
                                              "tags": {"type": "array", "items": {"type": "string"}}},
             "required": ["name"]},
    "Node": {"type": "object", "properties": {"label": {"type": "string"},
                                              "children": {"type": "array",
                                                           "items": {"$ref": "#/components/schemas/Node"}}},
             "required": ["label"]},
    "Card": {"type": "object", "properties": {"card_number": {"type": "string"}}, "required": ["card_number"]},
    "Iban": {"type": "object", "properties": {"iban": {"type": "string"}, "bic": {"type": "string"}},
             "required": ["iban"]},
}


def test_allof_oneof_recursive_bodies():
    paths = {
        "/products": _post("create_product", "Create a product in the catalog",
                           {"allOf": [{"$ref": "#/components/schemas/Base"},
                                      {"type": "object", "properties": {"price": {"type": "number"}},
                                       "required": ["price"]}]}),
        "/payments": _post("pay", "Pay an order with a card or a bank account",
                           {"oneOf": [{"$ref": "#/components/schemas/Card"}, {"$ref": "#/components/schemas/Iban"}]}),
        "/trees": _post("save_tree", "Save a category tree",
                        {"$ref": "#/components/schemas/Node"}, response={"$ref": "#/components/schemas/Node"}),
        "/tree-lookup": {"get": {"operationId": "get_tree", "summary": "Read the category tree by its root",
                                 "parameters": [{"name": "root", "in": "query", "required": True,
                                                 "schema": {"type": "string"}}],
                                 "responses": {"200": {"description": "ok", "content": {"application/json": {
                                     "schema": {"$ref": "#/components/schemas/Node"}}}}}}},
    }
    res = T.from_openapi(_api(paths, SCHEMAS))
    assert res.drops == [], [d.line() for d in res.drops]
    (s,) = res.servers
    by = {t["function"]["name"]: t["function"]["parameters"] for t in s.tools}
    for t in s.tools:
        assert T.validate_openai_tool(t) == [], t
    # allOf: properties of both parts, required = union
    assert set(by["create_product"]["properties"]) == {"name", "tags", "price"}
    assert sorted(by["create_product"]["required"]) == ["name", "price"]
    # oneOf of two objects: union of properties, only what both alternatives require is required (none)
    assert set(by["pay"]["properties"]) == {"card_number", "iban", "bic"}
    assert "required" not in by["pay"]
    kinds = {(n.tool, n.kind) for n in res.notes}
    assert ("pay", "one_of_flattened") in kinds
    # recursive request body: unfolded, then cut (not dropped); the cut is an open array-item object
    tree = by["save_tree"]
    assert tree["required"] == ["label"]
    level1 = tree["properties"]["children"]["items"]
    assert level1["properties"]["label"] == {"type": "string"}
    level2 = level1["properties"]["children"]["items"]
    assert level2["type"] == "object" and "recursive Node" in level2["description"]
    assert ("save_tree", "recursion_cut") in kinds
    # recursive response schema: the tool stays, its output fields come from the unfolded part
    assert s.outputs["get_tree"][:2] == ["label", "children"]
    assert "$ref" not in json.dumps(s.tools)


def test_form_multipart_raw_and_array_bodies():
    paths = {
        "/login": _post("login", "Log in with a user name and a password",
                        {"type": "object", "properties": {"username": {"type": "string"}, "password": {}},
                         "required": ["username", "password"]}, media="application/x-www-form-urlencoded"),
        "/upload": _post("upload_document", "Upload a document with its title",
                         {"type": "object", "properties": {"title": {"type": "string"},
                                                           "document": {"type": "string", "format": "binary"}},
                          "required": ["document"]}, media="multipart/form-data"),
        "/notes": _post("append_note", "Append a plain text note to the log", {"type": "string"},
                        media="text/plain"),
        "/batch": _post("tag_items", "Tag many items at once by their ids",
                        {"type": "array", "items": {"type": "integer"}}),
    }
    res = T.from_openapi(_api(paths, {}))
    assert res.drops == [], [d.line() for d in res.drops]
    by = {t["function"]["name"]: t["function"]["parameters"] for t in res.servers[0].tools}
    assert by["login"] == {"type": "object", "properties": {"username": {"type": "string"},
                                                            "password": {"type": "string"}},
                           "required": ["username", "password"]}
    assert by["upload_document"]["required"] == ["document"]
    assert "file content" in by["upload_document"]["properties"]["document"]["description"]
    assert by["append_note"]["properties"]["body"]["type"] == "string"
    assert by["append_note"]["required"] == ["body"]
    assert by["tag_items"]["properties"]["body"] == {"type": "array", "items": {"type": "integer"}}


def test_unmappable_operation_has_a_reason_line():
    paths = {"/a": _post("ok_one", "Do a perfectly clear thing", {"type": "object", "properties": {"x": {"type": "string"}}}),
             "/b": _post("ext_ref", "Refer to a schema in another file", {"$ref": "other.yaml#/Thing"}),
             "/c": _post("ok_two", "Do another perfectly clear thing", {"type": "object"})}
    res = T.from_openapi(_api(paths, {}), min_tools=1)
    assert [(d.tool, d.reason) for d in res.drops] == [("ext_ref", "unmappable_schema")]
    assert "not a local reference" in res.drops[0].detail
    assert [t["function"]["name"] for t in res.servers[0].tools] == ["ok_one", "ok_two"]


MCP_LIST = {"jsonrpc": "2.0", "id": 1, "result": {"tools": [
    {"name": "fs.read_file", "title": "Read file", "description": "Read a text file from the workspace.",
     "inputSchema": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]},
     "annotations": {"readOnlyHint": True, "openWorldHint": False}},
    {"name": "git/status", "description": "Show the working tree status of the repository.",
     "inputSchema": {"type": "object", "properties": {"repo_path": {"type": "string"}}, "required": ["repo_path"]},
     "annotations": {"readOnlyHint": True}},
    {"name": "git/commit", "description": "Record staged changes to the repository with a message.",
     "inputSchema": {"type": "object", "properties": {"repo_path": {"type": "string"}, "message": {"type": "string"}},
                     "required": ["repo_path", "message"]},
     "annotations": {"destructiveHint": False, "idempotentHint": False}},
    {"name": "notes.search", "description": "Search notes by a free text query string.",
     "inputSchema": {"type": "object", "properties": {"query": {"type": "string"}},
                     "$defs": {"Tree": {"type": "object", "properties": {"sub": {"$ref": "#/$defs/Tree"}}}}},
     "outputSchema": {"type": "object", "properties": {"hits": {"type": "array"}}}},
    {"name": "notes_search", "description": "Another tool whose sanitized name collides.",
     "inputSchema": {"type": "object", "properties": {}}},
]}}


def test_mcp_dotted_and_slashed_names(tmp_path):
    res = T.from_mcp(MCP_LIST, server="workspace")
    (s,) = res.servers
    assert [t["function"]["name"] for t in s.tools] == ["fs_read_file", "git_status", "git_commit", "notes_search"]
    assert s.names == {"fs_read_file": "fs.read_file", "git_status": "git/status", "git_commit": "git/commit",
                       "notes_search": "notes.search"}
    assert s.annotations["fs_read_file"] == {"readOnlyHint": True, "openWorldHint": False, "title": "Read file"}
    assert s.annotations["git_commit"] == {"destructiveHint": False, "idempotentHint": False}
    assert s.outputs["notes_search"] == ["hits"]
    # the real notes_search collides with the sanitized notes.search: dropped with the reason
    (d,) = res.drops
    assert (d.tool, d.reason) == ("notes_search", "duplicate_name") and "'notes.search'" in d.detail
    rec = s.record()
    assert rec["extra"]["astra"]["names"]["git_status"] == "git/status"
    assert rec["extra"]["astra"]["annotations"]["git_status"] == {"readOnlyHint": True}
    # the same file through the CLI: the rename is a note line, the drop a reason line
    p = tmp_path / "ws.mcp.json"
    p.write_text(json.dumps(MCP_LIST))
    r = run_cmd(["toolkit", "tools", "import", str(p)])
    assert r.returncode == 0, r.stderr
    assert "dropped ws.mcp/notes_search: duplicate_name" in r.stderr
    assert "note ws.mcp/git_status: renamed: 'git/status' → 'git_status'" in r.stderr


def test_same_sanitizer_for_every_source():
    name = "svc.v2/get item"
    oa = T.from_openai([{"name": name, "description": "Get one item of the service.", "parameters": {}}], min_tools=1)
    mcp = T.from_mcp([{"name": name, "description": "Get one item of the service.", "inputSchema": {}}], min_tools=1)
    bf = T.from_bfcl([{"name": name, "description": "Get one item of the service.",
                       "parameters": {"type": "dict", "properties": {}}}])
    api = T.from_openapi(_api({"/x": {"get": {"operationId": name, "summary": "Get one item of the service"}}}, {}),
                         min_tools=1)
    got = {r.servers[0].tools[0]["function"]["name"] for r in (oa, mcp, bf, api)}
    assert got == {"svc_v2_get_item"}
    assert all(r.servers[0].names == {"svc_v2_get_item": name} for r in (oa, mcp, bf, api))
    assert T.sanitize_name("ok_name-1") == "ok_name-1"
    long = "a." * 40
    assert len(T.sanitize_name(long)) == 64 and T.sanitize_name(long) != T.sanitize_name("b." * 40)


def test_cli_nothing_imported_exits_1(tmp_path):
    p = tmp_path / "few.json"
    p.write_text(json.dumps({"tools": [{"name": "only_one", "description": "The single tool of a tiny server."}]}))
    r = run_cmd(["toolkit", "tools", "import", str(p)])
    assert r.returncode == 1 and r.stdout == ""
    assert "dropped few: too_few_tools: 1 usable tool(s) (< 3): only_one" in r.stderr
    assert "nothing imported" in r.stderr


@pytest.mark.parametrize("bfcl_type,want", [("dict", "object"), ("float", "number"), ("tuple", "array"),
                                            ("any", "string"), ("long", "integer"), ("HashMap", "object"),
                                            ("Boolean", "string")])
def test_bfcl_type_map(bfcl_type, want):
    fn = {"name": "f.g", "description": "A function with one argument of a BFCL type.",
          "parameters": {"type": "dict", "properties": {"x": {"type": bfcl_type, "description": "The x."}},
                         "required": ["x"]}}
    res = T.from_bfcl({"id": "simple_0", "question": [[]], "function": [fn]})
    (s,) = res.servers
    assert s.name == "simple_0" and s.names == {"f_g": "f.g"}
    assert s.tools[0]["function"]["parameters"]["properties"]["x"]["type"] == want


def test_nullable_body_and_operations_without_an_id():
    paths = {"/pets/{pet_id}": {
        "parameters": [{"name": "pet_id", "in": "path", "schema": {"type": "integer"}}],
        "patch": {"summary": "Update some fields of a pet",
                  "requestBody": {"content": {"application/json": {"schema": {"anyOf": [
                      {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]},
                      {"type": "null"}]}}}}},
        "delete": {"summary": "Delete a pet from the store"}},
        "/broken": {"$ref": "#/components/pathItems/Nope"}}
    res = T.from_openapi(_api(paths, {}), min_tools=1)
    by = {t["function"]["name"]: t["function"]["parameters"] for t in res.servers[0].tools}
    assert by["patch_pets_pet_id"] == {"type": "object", "properties": {"pet_id": {"type": "integer"},
                                                                          "name": {"type": "string"}},
                                       "required": ["pet_id", "name"]}
    assert res.servers[0].names == {"patch_pets_pet_id": "PATCH /pets/{pet_id}",
                                    "delete_pets_pet_id": "DELETE /pets/{pet_id}"}
    # an unresolvable path item is a drop with its reason, not a silent skip
    assert [(d.tool, d.reason) for d in res.drops] == [("path_broken", "unmappable_schema")]
    assert "does not resolve" in res.drops[0].detail


def test_tau2_output_fields_failure_is_reported(monkeypatch):
    """τ² return annotations that cannot be read give no output fields — and a reason (it used to be a
    silent {} that left every chain reference to those tools 'unverified' without a word)."""
    from toolkit.envs import tau2 as TAU

    def boom(domain):
        raise RuntimeError("no such domain data")

    monkeypatch.setattr(TAU, "new_tau2_environment", boom, raising=False)
    problems: list = []
    assert T.tau2_output_fields("airline", problems) == {}
    assert len(problems) == 1 and "RuntimeError: no such domain data" in problems[0] and "unverified" in problems[0]
