"""ASTRA A2: transition graph, seeded biased walks, schema-based dependency check, gen-plan astra."""

import json
import random
from pathlib import Path

import pytest
from click.testing import CliRunner

from toolkit import cli
from toolkit.flows.astra import chains as CH
from toolkit.flows.astra import tooldocs as TD

DATA = Path(__file__).resolve().parents[2] / "data" / "astra"


@pytest.fixture(scope="module")
def notes():
    (s,) = TD.import_paths([str(DATA / "notes.mcp.json")]).servers
    return s


def step(tool, **args):
    return {"tool": tool, "args": args}


# ---------------------------------------------------------------------------------------------
# dependency check on hand-built chains


def test_valid_chains_kept(notes):
    ok = CH.verify_chain(["search_notes", "tag_note"], notes.tools, notes.outputs,
                         "Find my note about Groceries and tag it urgent.",
                         [step("search_notes", query="Groceries"), step("tag_note", note_id="$1.note_id", tag="urgent")])
    assert ok.ok, ok.reasons
    assert ok.bindings == [{"query": "task"}, {"note_id": "$1.note_id", "tag": "task"}]
    ok = CH.verify_chain(["create_note", "get_note"], notes.tools, notes.outputs,
                         "Create a note titled Trip with body 'pack socks', then read it back.",
                         [step("create_note", title="Trip", body="pack socks"), step("get_note", note_id="$1.note_id")])
    assert ok.ok, ok.reasons
    # without explicit arguments: names in the task or fields of earlier outputs
    ok = CH.verify_chain(["get_note", "tag_note"], notes.tools, notes.outputs,
                         "Open the note with note id N-7 and add the tag 'work'.")
    assert ok.ok, ok.reasons
    assert ok.bindings == [{"note_id": "task"}, {"note_id": "$1.note_id", "tag": "task"}]


@pytest.mark.parametrize("chain,task,args,why", [
    # required argument with no value at all
    (["tag_note"], "Tag my grocery note as urgent.", [step("tag_note", tag="urgent")],
     "required argument 'note_id' has no value"),
    # a literal the task never states (hallucinated id)
    (["tag_note"], "Tag my grocery note as urgent.", [step("tag_note", note_id="n-42", tag="urgent")],
     "value 'n-42' is not stated in the task"),
    # reference to a later step
    (["tag_note", "search_notes"], "Tag the Groceries note urgent.",
     [step("tag_note", note_id="$2.note_id", tag="urgent"), step("search_notes", query="Groceries")],
     "does not refer to an earlier step"),
    # reference to a field the earlier tool does not return
    (["create_note", "tag_note"], "Create a note Trip with body socks and tag it urgent.",
     [step("create_note", title="Trip", body="socks"), step("tag_note", note_id="$1.tags", tag="urgent")],
     "create_note returns no field 'tags'"),
    # wrong JSON type for a literal
    (["get_note"], "Read note 7.", [step("get_note", note_id=7)], "is not of type string"),
    # arguments for another tool than the chain's step
    (["get_note"], "Read note N-7.", [step("tag_note", note_id="N-7", tag="x")], "arguments are for 'tag_note'"),
])
def test_unsupported_chains_rejected(notes, chain, task, args, why):
    chk = CH.verify_chain(chain, notes.tools, notes.outputs, task, args)
    assert not chk.ok
    assert any(why in r for r in chk.reasons), chk.reasons


def test_unsupported_without_arguments(notes):
    chk = CH.verify_chain(["search_notes", "tag_note"], notes.tools, notes.outputs, "Tag it urgent please.")
    assert not chk.ok
    assert chk.reasons == ["step 1 search_notes: required argument 'query' is neither stated in the task nor "
                           "returned by an earlier tool"]


def test_enum_and_unknown_outputs():
    (pets,) = TD.import_paths([str(DATA / "petstore.openapi.json")]).servers
    chk = CH.verify_chain(["list_pets"], pets.tools, pets.outputs, "List fish.", [step("list_pets", species="fish")])
    assert not chk.ok and "is not one of ['cat', 'dog', 'bird']" in chk.reasons[0]
    # place_order needs pet_id: list_pets returns pet_id (response schema) -> supported
    chk = CH.verify_chain(["list_pets", "place_order"], pets.tools, pets.outputs, "Buy 2 of the dogs.",
                          [step("list_pets", species="dog"), step("place_order", pet_id="$1.pet_id", quantity=2)])
    assert chk.ok, chk.reasons
    outputs = dict(pets.outputs, list_pets=[])  # a tool that declares no outputs
    chk = CH.verify_chain(["list_pets", "place_order"], pets.tools, outputs, "Buy 2 of the dogs.",
                          [step("list_pets", species="dog"), step("place_order", pet_id="$1.pet_id", quantity=2)])
    assert chk.ok and chk.unverified == ["step 2 place_order.pet_id <- $1.pet_id"]
    chk = CH.verify_chain(["list_pets", "place_order"], pets.tools, outputs, "Buy 2 of the dogs.",
                          [step("list_pets", species="dog"), step("place_order", pet_id="$1.pet_id", quantity=2)],
                          strict_outputs=True)
    assert not chk.ok and "declares no output fields" in chk.reasons[0]


# ---------------------------------------------------------------------------------------------
# graph and walks


def test_graph_weights_count_consecutive_pairs():
    g = CH.build_graph([["a", "b", "c"], ["a", "b"], ["b", "c"], ["c", "a"]], nodes=["d"])
    assert g.weights == {("a", "b"): 2, ("b", "c"): 2, ("c", "a"): 1}
    assert g.nodes == ["d", "a", "b", "c"]
    dot = CH.export_dot(g, "s")
    assert '"a" -> "b" [label=2, weight=2];' in dot and '"d";' in dot


def test_walks_seeded_bounded_acyclic():
    g = CH.build_graph([["a", "b", "c", "d"], ["a", "c"], ["c", "a"], ["b", "d"], ["d", "a"]])
    w1 = CH.random_walks(g, 10, 3, min_len=2, seed=7)
    assert w1 == CH.random_walks(g, 10, 3, min_len=2, seed=7)
    assert w1 != CH.random_walks(g, 10, 3, min_len=2, seed=8)
    assert len({tuple(w) for w in w1}) == len(w1)
    for w in w1:
        assert 2 <= len(w) <= 3 and len(set(w)) == len(w)
        assert all((a, b) in g.weights for a, b in zip(w, w[1:]))


def test_walk_steps_follow_weights():
    rng = random.Random(0)
    picks = [CH._pick(rng, [("heavy", 9), ("light", 1)]) for _ in range(4000)]
    assert 0.87 < picks.count("heavy") / 4000 < 0.93


# ---------------------------------------------------------------------------------------------
# gen-plan --strategy astra with a scripted LLM

PAIRS = json.dumps({"pairs": [
    {"task": "Find the Groceries note and tag it urgent.", "chain": ["search_notes", "tag_note"]},
    {"task": "Write a note and tag it.", "chain": ["create_note", "tag_note"]},
    {"task": "Search then open a note.", "chain": ["search_notes", "get_note"]},
    {"task": "Open a note then tag it.", "chain": ["get_note", "tag_note"]}]})
QUERIES = {
    ("search_notes", "tag_note"): {"valid": True, "query": "Find my Groceries note and tag it urgent.",
                                   "arguments": [step("search_notes", query="Groceries"),
                                                 step("tag_note", note_id="$1.note_id", tag="urgent")]},
    # hallucinated note id: the LLM says valid, the schema check rejects it
    ("create_note", "tag_note"): {"valid": True, "query": "Create a note Trip with body socks and tag it.",
                                  "arguments": [step("create_note", title="Trip", body="socks"),
                                                step("tag_note", note_id="N-99", tag="travel")]},
}


def _reply(req):
    text = req["messages"][-1]["content"]
    if "Jointly synthesize" in text:
        return PAIRS
    chain = tuple(json.loads(text.split("<ToolInvocationChain>")[1].split("</ToolInvocationChain>")[0]))
    return json.dumps(QUERIES.get(chain, {"valid": False, "query": ""}))


def test_gen_plan_astra(tmp_path):
    from toolkit.llm.testserver import ScriptedServer

    r = CliRunner().invoke(cli.toolkit_group, ["tools", "import", str(DATA / "notes.mcp.json")])
    server_line = r.stdout.splitlines()[0]
    calls = []

    def reply(req):
        calls.append(req)
        if len(calls) == 1:
            return '{"pairs": [{"task": "x", "chain": ["delete_everything"]}]}'  # unknown tool: retried
        return _reply(req)

    with ScriptedServer(reply) as srv:
        r = CliRunner().invoke(cli.gen_plan, ["--strategy", "astra", "--base-url", srv.base_url, "--model", "m",
                                              "--out-dir", str(tmp_path), "-n", "3", "--seed", "1"],
                               input=server_line + "\n")
    assert r.exit_code == 0, r.output
    plans = [json.loads(x) for x in r.stdout.splitlines()]
    assert [p["plan"]["tool_chain"] for p in plans] == [["search_notes", "tag_note"]]
    p = plans[0]
    assert p["parent_id"] == "server-notes" and p["env"]["backend"] == "simulated"
    assert p["plan"]["synthesis_plan"] == "Find my Groceries note and tag it urgent."
    assert p["extra"]["astra"]["server"] == "notes"
    g = json.loads((tmp_path / "notes.graph.json").read_text())
    assert {"from": "search_notes", "to": "tag_note", "weight": 1} in g["edges"]
    rej = {tuple(w["chain"]): w for w in g["walks"] if not w["kept"]}
    assert any("N-99" in x for x in rej[("create_note", "tag_note")]["reasons"])
    assert (tmp_path / "notes.graph.dot").read_text().startswith('digraph "notes"')
    # the malformed first reply (an unknown tool) was retried with a request that differs, and said so
    assert "attempt 2/3 after a malformed reply (pairs[0].chain uses unknown tool(s) ['delete_everything'])" in r.stderr
    assert calls[0]["messages"] == calls[1]["messages"]
    assert (calls[0]["seed"], calls[1]["seed"]) == (1, 2) and calls[1]["temperature"] > calls[0]["temperature"]
    # the first (task, chain) reply named an unknown tool: rejected and asked again, exactly once
    synth = [c for c in calls if "Jointly synthesize" in (c["messages"][-1].get("content") or "")]
    assert len(synth) == 2 and calls[0] is synth[0]
    assert "delete_everything" not in json.dumps(g) and "delete_everything" not in r.stdout


def test_gen_plan_astra_rejects_small_server():
    doc = {"server": "tiny", "tools": [{"name": "ping_host", "description": "Ping a host and report latency.",
                                        "parameters": {"type": "object", "properties": {}}}]}
    rec = {"id": "tiny", "extra": {"tool_docs": doc}}
    r = CliRunner().invoke(cli.gen_plan, ["--strategy", "astra", "--base-url", "http://127.0.0.1:9/v1"],
                           input=json.dumps(rec) + "\n")
    assert r.exit_code == 1
    assert "too_few_tools" in r.stderr


def test_candidates_are_a_weight_biased_random_sample_not_the_heaviest():
    """ASTRA §2.1.2: candidates are the sampled walks (biased by w), not the heaviest ones. Graph:
    a→b weight 9, a→c weight 1, walks of length 2 (only a can start): the first candidate is a→c
    with probability 1/10, so over 1000 seeds about 100 times (± 3σ ≈ 28); ranking by weight would
    never put it first."""
    from toolkit.flows.astra import chains as CH
    from toolkit.flows.astra.plan import candidate_walks

    g = CH.build_graph([["a", "b"]] * 9 + [["a", "c"]], nodes=["a", "b", "c"])
    firsts = [candidate_walks(g, 24, 2, min_len=2, seed=s)[0] for s in range(1000)]
    light = sum(1 for w in firsts if w == ["a", "c"])
    assert 72 <= light <= 128, light
    assert candidate_walks(g, 24, 2, min_len=2, seed=3) == CH.random_walks(g, 24, 2, min_len=2, seed=3)
