"""Constrained decoding of tool calls (toolkit.llm.constrain) through LLMClient against the
loopback ScriptedServer: what the request body carries, and what comes back."""

import asyncio
import json
import re

import pytest

from toolkit.llm import LLMClient, LLMConfig
from toolkit.llm.constrain import request_extras, tool_grammar
from toolkit.llm.testserver import ScriptedServer

TOOLS = [
    {"type": "function", "function": {
        "name": "get_order", "description": "Look up an order",
        "parameters": {"type": "object", "properties": {"order_id": {"type": "string"},
                                                        "verbose": {"type": "boolean"}},
                       "required": ["order_id"]}}},
    {"type": "function", "function": {
        "name": "cancel_order", "description": "Cancel an order",
        "parameters": {"type": "object", "properties": {"order_id": {"type": "string"},
                                                        "reason": {"type": "string", "enum": ["lost", "other"]}},
                       "required": ["order_id", "reason"]}}},
]
OFFERED = {"get_order", "cancel_order"}
USER = [{"role": "user", "content": "Where is my order W1?"}]
CONSTRAINT_KEYS = ("grammar", "structured_outputs", "response_format", "guided_json", "guided_grammar")


def cfg(srv, **kw):
    return LLMConfig(base_url=srv.base_url, model="m", backoff_base=0.01, backoff_max=0.05, timeout=10,
                     max_retries=0, **kw)


def chat(client, *args, **kw):
    async def go():
        try:
            return await client.chat(*args, **kw)
        finally:
            await client.aclose()
    return asyncio.run(go())


def grammar_names(g: str) -> set[str]:
    """The tool names a GBNF grammar allows after "name": (one `tc-json-I-name` rule per tool, and
    `tc-json` is the alternation of exactly those `tc-json-I`)."""
    names = dict(re.findall(r'^(tc-json-\d+)-name ::= "\\"([^"\\]+)\\""', g, re.MULTILINE))
    alts = re.search(r"^tc-json ::= (.*)$", g, re.MULTILINE).group(1).split(" | ")
    assert sorted(alts) == sorted(names)
    return set(names.values())


def test_grammar_mode_sends_grammar_with_exactly_the_offered_tools():
    # per-tool argument rules come from llama-cpp-python's schema converter (embedded extra); without
    # it the grammar pins the names only (counted fallback), which the names test below covers
    pytest.importorskip("llama_cpp", reason="argument rules need llama-cpp-python (the embedded extra)")
    reply = '<tool_call>\n{"name": "get_order", "arguments": {"order_id": "W1"}}\n</tool_call>'
    with ScriptedServer([reply]) as srv:
        res = chat(LLMClient(cfg(srv, constrain_tool_calls="grammar")), USER, tools=TOOLS)
        body = srv.requests[0]
    # auto protocol -> hermes: tools are in the prompt, not the body
    assert "tools" not in body and "<tools>" in body["messages"][0]["content"]
    assert "Reply with exactly one JSON object" not in body["messages"][0]["content"]
    g = body["grammar"]
    assert body["structured_outputs"] == {"grammar": g}  # vLLM's key, same grammar
    assert grammar_names(g) == OFFERED
    assert g.startswith("root ::= tc-calls | tc-text\n")
    assert '"<tool_call>\\n" tc-json "\\n</tool_call>"' in g
    # arguments follow each tool's schema: cancel_order's enum is in the grammar
    assert '\\"lost\\"' in g and '\\"other\\"' in g
    assert res.tool_calls[0]["function"]["name"] == "get_order" and res.parse_error is None
    assert res.constrained == "grammar" and res.provenance()["constrained"] == "grammar"


def test_grammar_fallback_without_schema_converter_still_pins_names():
    g = tool_grammar(TOOLS, use_schema=False)
    assert grammar_names(g) == OFFERED
    assert "lost" not in g  # arguments are any JSON object here


def test_json_schema_mode_schema_and_text_reply_unwrapped():
    replies = ['{"content": "Your order is on its way."}',
               '{"name": "cancel_order", "arguments": {"order_id": "W1", "reason": "lost"}}']
    with ScriptedServer(replies) as srv:
        client = LLMClient(cfg(srv, constrain_tool_calls="json_schema"))
        text = chat(client, USER, tools=TOOLS)
        call = chat(client, USER + [{"role": "user", "content": "cancel it"}], tools=TOOLS)
        body = srv.requests[0]
    rf = body["response_format"]
    assert rf["type"] == "json_schema"
    branches = rf["json_schema"]["schema"]["anyOf"]
    names = {b["properties"]["name"]["const"] for b in branches if "name" in b["properties"]}
    assert names == OFFERED
    by_name = {b["properties"]["name"]["const"]: b for b in branches if "name" in b["properties"]}
    assert by_name["cancel_order"]["properties"]["arguments"]["properties"]["reason"]["enum"] == ["lost", "other"]
    assert [b for b in branches if "content" in b["properties"]]  # a plain reply stays possible
    assert "grammar" not in body
    assert body["messages"][0]["content"].endswith('{"content": <your reply as a JSON string>} to answer without one.')
    assert text.content == "Your order is on its way." and text.tool_calls == []
    assert call.tool_calls[0]["function"]["name"] == "cancel_order"
    assert json.loads(call.tool_calls[0]["function"]["arguments"]) == {"order_id": "W1", "reason": "lost"}


def test_embedded_flavour_uses_llama_cpp_python_keys():
    g = request_extras("grammar", TOOLS, embedded=True)
    assert set(g) == {"grammar"} and grammar_names(g["grammar"]) == OFFERED
    j = request_extras("json_schema", TOOLS, embedded=True)
    assert j["response_format"]["type"] == "json_object" and "anyOf" in j["response_format"]["schema"]
    assert request_extras("off", TOOLS, embedded=True) == {} and request_extras("grammar", None, embedded=False) == {}


def test_off_sends_no_constraint():
    with ScriptedServer(["hi", "hi"]) as srv:
        res = chat(LLMClient(cfg(srv, tool_protocol="hermes")), USER, tools=TOOLS)
        chat(LLMClient(cfg(srv, constrain_tool_calls="grammar")), USER)  # no tools: nothing to constrain
        bodies = list(srv.requests)
    for body in bodies:
        assert not any(k in body for k in CONSTRAINT_KEYS)
    assert res.constrained is None and "constrained" not in res.provenance()


def test_strict_mode_native_tools():
    reply = {"tool_calls": [{"name": "get_order", "arguments": {"order_id": "W1", "verbose": None}}]}
    with ScriptedServer([reply]) as srv:
        res = chat(LLMClient(cfg(srv, constrain_tool_calls="strict")), USER, tools=TOOLS)
        body = srv.requests[0]
    assert not any(k in body for k in CONSTRAINT_KEYS)
    assert [t["function"]["name"] for t in body["tools"]] == ["get_order", "cancel_order"]
    for t in body["tools"]:
        fn = t["function"]
        assert fn["strict"] is True and fn["parameters"]["additionalProperties"] is False
        assert sorted(fn["parameters"]["required"]) == sorted(fn["parameters"]["properties"])
    assert body["tools"][0]["function"]["parameters"]["properties"]["verbose"]["type"] == ["boolean", "null"]
    assert body["tools"][0]["function"]["parameters"]["properties"]["order_id"]["type"] == "string"
    assert TOOLS[0]["function"]["parameters"]["required"] == ["order_id"]  # the caller's tools untouched
    # the null strict forced into the optional parameter is dropped again
    assert json.loads(res.tool_calls[0]["function"]["arguments"]) == {"order_id": "W1"}


@pytest.mark.parametrize("mode", ["off", "grammar", "json_schema"])
def test_unknown_tool_from_a_server_that_ignores_the_constraint_is_flagged(mode):
    """The scripted server ignores grammars: a call naming an unknown tool comes back as before
    (for the rollout to reject as an unknown tool); with a constraint on, parse_error says so."""
    reply = '<tool_call>\n{"name": "delete_everything", "arguments": {}}\n</tool_call>'
    with ScriptedServer([reply]) as srv:
        res = chat(LLMClient(cfg(srv, tool_protocol="hermes", constrain_tool_calls=mode)), USER, tools=TOOLS)
    assert [c["function"]["name"] for c in res.tool_calls] == ["delete_everything"]
    if mode == "off":
        assert res.parse_error is None
    else:
        assert "'delete_everything'" in res.parse_error and "not an offered tool" in res.parse_error


def test_contradicting_protocol_is_an_error():
    with pytest.raises(ValueError, match="hermes text protocol"):
        LLMClient(LLMConfig(base_url="http://127.0.0.1:9/v1", tool_protocol="native", constrain_tool_calls="grammar"))
    with pytest.raises(ValueError, match="native tools"):
        LLMClient(LLMConfig(base_url="http://127.0.0.1:9/v1", tool_protocol="hermes", constrain_tool_calls="strict"))
    with pytest.raises(ValueError, match="must be one of"):
        LLMClient(LLMConfig(base_url="http://127.0.0.1:9/v1", constrain_tool_calls="regex"))


def test_cache_keys_differ_by_constraint(tmp_path):
    db = str(tmp_path / "c.sqlite")
    with ScriptedServer(["a", "b"]) as srv:
        chat(LLMClient(cfg(srv, tool_protocol="hermes", cache=db)), USER, tools=TOOLS)
        res = chat(LLMClient(cfg(srv, tool_protocol="hermes", cache=db, constrain_tool_calls="grammar")),
                   USER, tools=TOOLS)
        again = chat(LLMClient(cfg(srv, tool_protocol="hermes", cache=db, constrain_tool_calls="grammar")),
                     USER, tools=TOOLS)
        assert srv.chat_count == 2
    assert res.content == "b" and not res.cached
    assert again.cached and again.constrained == "grammar"


def _llama_vocab():
    """llama.cpp's own grammar engine over the embedded model's vocabulary (vocab only: no weights
    are loaded, ~0.2 s); skipped where llama-cpp-python or the packaged GGUF is missing."""
    llama_cpp = pytest.importorskip("llama_cpp")
    from toolkit.llm.embedded import EmbeddedServerError, embedded_model_path

    try:
        path = embedded_model_path()
    except EmbeddedServerError as exc:
        pytest.skip(str(exc))
    llama_cpp.llama_backend_init()
    mp = llama_cpp.llama_model_default_params()
    mp.vocab_only = True
    model = llama_cpp.llama_model_load_from_file(path.encode(), mp)
    if not model:
        pytest.skip("could not load the GGUF vocabulary")
    return llama_cpp, model, llama_cpp.llama_model_get_vocab(model)


def _grammar_accepts(llama_cpp, vocab, grammar: str, text: str) -> bool:
    """Does llama.cpp's grammar sampler allow every token of `text`, in order?"""
    import ctypes
    import math

    raw = text.encode()
    buf = (llama_cpp.llama_token * (len(raw) + 8))()
    n = llama_cpp.llama_tokenize(vocab, raw, len(raw), buf, len(buf), False, True)
    sampler = llama_cpp.llama_sampler_init_grammar(vocab, grammar.encode(), b"root")
    assert sampler, "llama.cpp could not parse the grammar"
    try:
        for tok in buf[:n]:
            data = (llama_cpp.llama_token_data * 1)(llama_cpp.llama_token_data(tok, 0.0, 0.0))
            arr = llama_cpp.llama_token_data_array(data, 1, -1, False)
            llama_cpp.llama_sampler_apply(sampler, ctypes.byref(arr))
            if math.isinf(data[0].logit):
                return False
            llama_cpp.llama_sampler_accept(sampler, tok)
        return True
    finally:
        llama_cpp.llama_sampler_free(sampler)


@pytest.mark.parametrize("use_schema", [True, False])
def test_llama_cpp_grammar_engine_allows_text_and_real_calls_only(use_schema):
    llama_cpp, model, vocab = _llama_vocab()
    try:
        g = tool_grammar(TOOLS, use_schema=use_schema)
        ok = ["Your order W1 is on its way.",
              '<tool_call>\n{"name": "get_order", "arguments": {"order_id": "W1"}}\n</tool_call>',
              ('<tool_call>\n{"name": "get_order", "arguments": {"order_id": "W1"}}\n</tool_call>\n'
               '<tool_call>\n{"name": "cancel_order", "arguments": {"order_id": "W1", "reason": "lost"}}\n</tool_call>')]
        bad = ['<tool_call>\n{"name": "delete_everything", "arguments": {}}\n</tool_call>',
               '<tool_call>\n{"name": "<function-name>", "arguments": {"<parameter-name>": "<value>"}}\n</tool_call>',
               '{"name": "get_order", "arguments": {"order_id": "W1"}}',   # bare JSON: would parse as a call
               "Let me check. <tool_call>",                                 # a tag inside text
               '<tool_response>\n{"name": "get_order"}']
        for text in ok:
            assert _grammar_accepts(llama_cpp, vocab, g, text), text
        for text in bad:
            assert not _grammar_accepts(llama_cpp, vocab, g, text), text
        invalid_arg = '<tool_call>\n{"name": "cancel_order", "arguments": {"order_id": "W1", "reason": "bored"}}'
        assert _grammar_accepts(llama_cpp, vocab, g, invalid_arg) is (not use_schema)  # enum enforced with the schema
    finally:
        llama_cpp.llama_model_free(model)


@pytest.mark.parametrize("domain", ["airline", "clinic"])
def test_bundled_domain_grammar_parses_in_llama_cpp(domain):
    """The grammar for a bundled domain's real tool list (untyped properties, length bounds) is
    accepted by llama.cpp, keeps every tool's argument rules (no names-only fallback), stays small,
    and still pins the names."""
    pytest.importorskip("llama_cpp", reason="llama-cpp-python (the embedded extra) parses the grammar")
    from toolkit import domains
    from toolkit.envs import load_env
    from toolkit.llm.constrain import _call_json_rules
    from toolkit.schema import Record

    rec = Record.model_validate(domains.load_tasks(domain)[0])
    env = load_env(rec.env)
    try:
        tools = [t if isinstance(t, dict) else t.model_dump() for t in env.tools("agent")]
    finally:
        env.close()
    names = {t["function"]["name"] for t in tools}
    _, how = _call_json_rules(tools)
    g = tool_grammar(tools)
    assert how == "schema" and grammar_names(g) == names and len(g) < 150_000
    llama_cpp, model, vocab = _llama_vocab()
    try:
        first = min(names)
        assert _grammar_accepts(llama_cpp, vocab, g, "I can help with that.")
        assert _grammar_accepts(llama_cpp, vocab, g, '<tool_call>\n{"name": "' + first + '", "arguments": {')
        assert not _grammar_accepts(llama_cpp, vocab, g, '<tool_call>\n{"name": "' + first + 'x", "arguments": {')
        # json_schema on the embedded server: llama-cpp-python turns the schema into a grammar itself
        from llama_cpp.llama_grammar import json_schema_to_gbnf

        schema = request_extras("json_schema", tools, embedded=True)["response_format"]["schema"]
        gj = json_schema_to_gbnf(json.dumps(schema))
        assert _grammar_accepts(llama_cpp, vocab, gj, '{"content": "Hello."}')
        assert _grammar_accepts(llama_cpp, vocab, gj, '{"name": "' + first + '", "arguments": {')
        assert not _grammar_accepts(llama_cpp, vocab, gj, '{"name": "' + first + 'x"')
    finally:
        llama_cpp.llama_model_free(model)


def test_call_schema_hoists_each_tools_defs_to_the_root():
    """A tool whose parameters use `$defs` (the tau2 tools): nested under anyOf/.../arguments its
    `#/$defs/X` pointers would dangle (vLLM refused the schema); they move to the root, renamed per
    tool, and the schema validates real calls and refuses bad ones."""
    jsonschema = pytest.importorskip("jsonschema")
    from toolkit.llm.constrain import call_schema

    def tool(name, item):
        return {"type": "function", "function": {"name": name, "parameters": {
            "type": "object", "properties": {"items": {"type": "array", "items": {"$ref": "#/$defs/Item"}}},
            "required": ["items"], "$defs": {"Item": item}}}}

    s = call_schema([tool("a", {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}),
                     tool("b", {"type": "string", "enum": ["x"]})])
    assert set(s["$defs"]) == {"t0_Item", "t1_Item"} and "$defs" not in json.dumps(s["anyOf"]).replace("#/$defs/", "")
    jsonschema.validate({"name": "a", "arguments": {"items": [{"n": 1}]}}, s)
    jsonschema.validate({"name": "b", "arguments": {"items": ["x"]}}, s)
    jsonschema.validate({"content": "hi"}, s)
    for bad in ({"name": "a", "arguments": {"items": [{"n": "1"}]}}, {"name": "b", "arguments": {"items": ["y"]}},
                {"name": "c", "arguments": {}}):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(bad, s)
