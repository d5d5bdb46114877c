"""`bash recipes/astra.sh both 2` end to end (one subprocess, every stage a real CLI) against a loopback
scripted LLM answering every role by hand in the paper's formats; checks each stage's row of the
printed yield tables and that the final files (sft.jsonl, rl.jsonl) are non-empty."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from toolkit.llm.testserver import ScriptedServer

ROOT = Path(__file__).resolve().parents[3]

# ---------------------------------------------------------------- pipeline A (tool chains)
PAIRS = {
    "notes": {"pairs": [{"task": "Find my Groceries note and tag it urgent.", "chain": ["search_notes", "tag_note"]}]},
    "petstore": {"pairs": [{"task": "Find a cat in the shop and order it.", "chain": ["list_pets", "place_order"]}]},
}
QUERIES = {
    ("search_notes", "tag_note"): {
        "valid": True, "query": "Find my note titled Groceries and tag it urgent.",
        "arguments": [{"tool": "search_notes", "args": {"query": "Groceries"}},
                      {"tool": "tag_note", "args": {"note_id": "$1.note_id", "tag": "urgent"}}]},
    ("list_pets", "place_order"): {
        "valid": True, "query": "Find a cat in the shop and order 1 of it.",
        "arguments": [{"tool": "list_pets", "args": {"species": "cat"}},
                      {"tool": "place_order", "args": {"pet_id": "$1.pet_id", "quantity": 1}}]},
}
SERVER_TASKS = {"notes": ["Create a note titled Trip with body 'pack socks'.", "Search my notes for 'invoice'."],
                "petstore": ["Show me the dogs you have, at most 3.", "What is pet 7?"]}
# the agent's first call per task family (keyed by a word of the instruction)
AGENT_CALLS = [("Groceries", "search_notes", {"query": "Groceries"}), ("Trip", "create_note",
               {"title": "Trip", "body": "pack socks"}), ("invoice", "search_notes", {"query": "invoice"}),
               ("cat", "list_pets", {"species": "cat"}), ("dogs", "list_pets", {"species": "dog", "limit": 3}),
               ("pet 7", "get_pet", {"pet_id": 7})]
JUDGE = {"reasoning": "understood and answered", "query_understanding": 1, "query_planning": 1,
         "tool_context_understanding": 1.0, "tool_context_planning": 1.0,
         "tool_conciseness": 1.0, "final_answer_quality": 1.0}

# ---------------------------------------------------------------- pipeline B (QA environments)
QA = {
    "weather": [{"scenario_type": "Parallel Multi-Hop",
                 "main_question": "How many degrees warmer is Paris than Berlin today?", "final_answer": "4 degrees",
                 "decomposition_trace": [
                     {"_uuid": 1, "hop_level": 1, "sub_question": "What is the temperature in Paris today?",
                      "is_parallel": True, "dependency": None, "sub_answer": "18"},
                     {"_uuid": 2, "hop_level": 1, "sub_question": "What is the temperature in Berlin today?",
                      "is_parallel": True, "dependency": None, "sub_answer": "14"},
                     {"_uuid": 3, "hop_level": 2, "sub_question": "What is the difference between 18 and 14 degrees?",
                      "is_parallel": False, "dependency": [1, 2], "sub_answer": "4 degrees"}]}],
    "library": [{"scenario_type": "Single-Hop", "main_question": "Who wrote the book Dune?",
                 "final_answer": "Frank Herbert",
                 "decomposition_trace": [{"_uuid": 1, "hop_level": 1, "sub_question": "Who wrote the book Dune?",
                                          "is_parallel": False, "dependency": None, "sub_answer": "Frank Herbert"}]}],
}
TEMP_DOC = {"name": "get_temperature",
            "description": "Get today's temperature of a city; returns city and temperature_c.",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
AUTHOR_DOC = {"name": "get_book_author",
              "description": "Look up the author of a book by its title; returns title and author.",
              "parameters": {"type": "object", "properties": {"title": {"type": "string"}}, "required": ["title"]}}
TEMP_IMPL = '''
def get_temperature(city):
    """Today's temperature of a city (toy data)."""
    data = {DATA}
    if not isinstance(city, str):
        return {"error": "city must be a string"}
    if city not in data:
        return {"error": "unknown city " + city}
    return {"city": city, "temperature_c": data[city]}
'''
AUTHOR_IMPL = '''
def get_book_author(title):
    """The author of a book (toy data)."""
    books = {"Dune": "Frank Herbert"}
    if not isinstance(title, str) or title not in books:
        return {"error": "unknown book"}
    return {"title": title, "author": books[title]}
'''


def _city(text):
    return "Berlin" if "Berlin" in text else "Paris"


# the first reply of these roles breaks its contract (the role retries; the yield rows count the extra request)
MALFORMED = {"task_scores": '{"question_quality": "high", "scenario_realism": 4}',      # not an integer, one missing
             "judge": '{"reasoning": "ok", "query_understanding": 0.7}',  # not in {0, .5, 1}; dimensions missing
             "qa_synth": '[{"scenario_type": "Single-Hop", "main_question": "Who wr'}  # truncated JSON
_broken: set = set()


def _once(kind, good):
    if kind in _broken:
        return good
    _broken.add(kind)
    return MALFORMED[kind]


def reply(req):
    msgs = req["messages"]
    text = msgs[-1]["content"] or ""
    if req.get("tools"):  # the rollout agent: one tool call, then a final answer
        instr = next(m["content"] for m in msgs if m["role"] == "user")
        calls = [m for m in msgs if m["role"] == "assistant" and m.get("tool_calls")]
        names = {t["function"]["name"] for t in req["tools"]}
        if "get_temperature" in names:  # a QA environment: both lookups, then the answer
            plan = [("get_temperature", {"city": "Paris"}), ("get_temperature", {"city": "Berlin"})]
        elif "get_book_author" in names:
            plan = [("get_book_author", {"title": "Dune"})]
        else:
            plan = [next((n, a) for key, n, a in AGENT_CALLS if key in instr)]
        if len(calls) < len(plan):
            name, args = plan[len(calls)]
            return {"tool_calls": [{"name": name, "arguments": args}]}
        return "4 degrees" if "get_temperature" in names else ("Frank Herbert" if "get_book_author" in names
                                                                else "Done: see the results above.")
    if "Jointly synthesize" in text:
        return json.dumps(PAIRS["petstore" if "list_pets" in text else "notes"])
    if "<ToolInvocationChain>" in text:
        chain = tuple(json.loads(text.rsplit("<ToolInvocationChain>", 1)[1].split("</ToolInvocationChain>")[0]))
        return json.dumps(QUERIES.get(chain, {"valid": False, "query": "", "arguments": []}))
    if "writes realistic requests" in text:
        return json.dumps({"tasks": SERVER_TASKS["petstore" if "list_pets" in text else "notes"]})
    if text.startswith("Rewrite a user request"):
        orig = text.split("Original request:\n", 1)[1].split("\n\nAxis:", 1)[0].strip()
        axis = text.split("Axis: ")[1].split(" ")[0]
        return json.dumps({"task": {"diversity": "Please, could you do this for me: ",
                                    "complexity": "Step by step: ", "persona": "As a busy parent: "}[axis] + orig})
    if text.startswith("You rate a user task"):
        return _once("task_scores", json.dumps({"question_quality": 4, "scenario_realism": 4, "tool_necessity": 5,
                                                "reasoning": "ok"}))
    if "Tool call to simulate" in text:
        call = text.split("Tool call to simulate:")[1]
        if "search_notes" in call:
            obs = [{"note_id": "N-1", "title": "Groceries"}]
        elif "list_pets" in call:
            obs = [{"pet_id": 7, "name": "Tom", "species": "cat", "owner_id": "O-1"}]
        else:
            obs = {"status": "ok"}
        return json.dumps({"success": True, "observation": obs})
    if "six trajectory-level dimensions" in text:  # the 7th, TCS, is computed from the steps
        return _once("judge", json.dumps(JUDGE))
    if "expert Data Architect" in text:
        return _once("qa_synth", json.dumps(QA["weather" if "Paris" in text else "library"]))
    if text.startswith("You check a decomposed question for tool use"):
        nodes = [json.loads(line) for line in text.splitlines() if line.startswith('{"index"')]
        return json.dumps({"sub_questions": [
            {"index": n["index"], "needs_tool": "difference" not in n["q"],
             "category": "comparison" if "difference" in n["q"] else "retrieval"} for n in nodes]})
    if text.startswith("You evaluate the decomposition"):
        n = 3 if "Berlin" in text else 1
        return json.dumps({"nodes": [{"index": i, "dc": 1, "sa": 1, "sr": 1} for i in range(n)], "tc": 1,
                           "reasoning": "fine"})
    if text.startswith("Write the API tool"):
        return json.dumps(AUTHOR_DOC if "Dune" in text else TEMP_DOC)
    if text.startswith("Write the call statement"):
        q = text.split("Sub-question:")[1].split("\n")[0]
        if "Dune" in q:
            return json.dumps({"name": "get_book_author", "arguments": {"title": "Dune"}})
        return json.dumps({"name": "get_temperature", "arguments": {"city": _city(q)}})
    if text.startswith("Implement a function"):
        if "get_book_author" in text:
            return json.dumps({"analysis": "a table", "function": AUTHOR_IMPL})
        pairs = text.split("Question-Answer Pairs:")[-1]
        data = {"Berlin": 14} if "Berlin" in pairs else {"Paris": 18}
        return json.dumps({"analysis": "a table", "function": TEMP_IMPL.replace("{DATA}", json.dumps(data))})
    if text.startswith("Group homogeneous"):
        return json.dumps({"groups": [[0, 1]]})
    if text.startswith("Extend an existing"):
        new_city = "Berlin" if '"Paris"' in text.split("Current implementation:")[1].split("Calls")[0] else "Paris"
        return json.dumps({"analysis": "add a row",
                           "call": {"name": "get_temperature", "arguments": {"city": new_city}},
                           "function": TEMP_IMPL.replace("{DATA}", json.dumps({"Paris": 18, "Berlin": 14}))})
    raise AssertionError("unscripted prompt: " + text[:300])


def _table(path):
    return {r["stage"]: r for r in json.loads(Path(path).read_text())}


def test_astra_recipe_both(tmp_path):
    out = tmp_path / "astra"
    _broken.clear()
    with ScriptedServer(reply) as srv:
        env = {**os.environ, "OUT": str(out), "TOOLKIT_PYTHON": sys.executable,
               "PATH": f"{ROOT / 'bin'}:{Path(sys.executable).parent}:{os.environ['PATH']}",
               "PYTHONPATH": str(ROOT), "LLM_ARGS": f"--base-url {srv.base_url} --model scripted"}
        env.pop("TOOLKIT_STAGE_LOG", None)
        p = subprocess.run(["bash", "recipes/astra.sh", "both", "2"], cwd=ROOT, env=env, capture_output=True,
                           check=False, text=True, timeout=240)
    assert p.returncode == 0, p.stderr[-4000:]
    assert "== ASTRA tools: yield / cost per stage" in p.stderr and "== ASTRA qa: yield / cost per stage" in p.stderr
    printed = p.stderr.split("== ASTRA qa")[1]
    assert re.search(r"^verify f1 \(replay\)\s+2\s+2\s+1\.0\s", printed, re.MULTILINE), printed

    tools = _table(out / "tools.yield.json")
    assert list(tools) == ["gen-plan", "gen-task", "validate-task", "rollout", "verify judge", "total"]
    # 2 servers → 1 chain plan each (one (task, chain) pair, one walk shape); server-only tasks need no plan
    assert (tools["gen-plan"]["in"], tools["gen-plan"]["out"], tools["gen-plan"]["rejected"]) == (2, 2, 0)
    # gen-task reads the 2 chain plans and the 2 server records (T = T_chain ∪ T_server): per chain plan
    # the chain task + 3 augmentations (2 x 4); per server -n 2 server-only tasks + 3 augmentations each
    # (2 x 2 x 4): 8 + 16 = 24
    assert (tools["gen-task"]["in"], tools["gen-task"]["out"]) == (4, 24)
    tasks = [json.loads(x) for x in (out / "tasks.jsonl").read_text().splitlines()]
    origins = [t["task"]["extra"]["origin"] for t in tasks]
    assert origins.count("chain") == 8 and origins.count("server") == 16
    assert tools["validate-task"]["in"] == 24 and tools["validate-task"]["out"] == 24
    assert tools["validate-task"]["pass"] == 1.0
    assert (tools["rollout"]["in"], tools["rollout"]["out"], tools["rollout"]["rejected"]) == (24, 24, 0)
    assert (tools["verify judge"]["in"], tools["verify judge"]["out"]) == (24, 24)
    assert tools["verify judge"]["pass"] == 1.0
    # LLM requests, counted by hand: per server 1 (task, chain) synthesis + 1 chain query; gen-task: 3
    # augmentations per chain task (2 x 3) + 1 server-task synthesis per server (2) + 3 augmentations per
    # server task (4 x 3); 1 score / judge call per task plus the one retry after the malformed first reply
    assert [tools[s]["llm_requests"] for s in ("gen-plan", "gen-task", "validate-task", "verify judge")] == \
        [2 * 2, 2 * 3 + 2 + 4 * 3, 24 + 1, 24 + 1]
    assert tools["rollout"]["llm_requests"] >= 24 * 2  # agent: 1 call + final answer (+ emulator calls)
    sft = [json.loads(x) for x in (out / "sft.jsonl").read_text().splitlines()]
    assert len(sft) == 24 and all(len(r["trajectories"]) == 1 for r in sft)
    assert {r["env"]["backend"] for r in sft} == {"simulated"}  # no implementation: the emulator
    calls = [m["tool_calls"][0]["function"]["name"] for r in sft for m in r["trajectories"][0]["messages"]
             if m.get("tool_calls")]
    assert set(calls) == {"search_notes", "list_pets", "create_note", "get_pet"}
    # TCS is computed from the steps: a call the emulator failed (injected fault) scores 0, others 1
    for r in sft:
        t = r["trajectories"][0]
        v = next(v for v in r["verdicts"] if v["name"] == "judge")
        agent = [s for s in t["steps"] if s.get("side", "agent") == "agent"]
        assert v["scores"]["tool_call_status"] == sum(s["ok"] for s in agent) / len(agent)

    qa = _table(out / "qa.yield.json")
    assert list(qa) == ["gen-task", "validate-task", "make-verifier", "rollout replay", "verify f1 (replay)",
                        "rollout", "verify f1", "total"]
    assert (qa["gen-task"]["in"], qa["gen-task"]["out"], qa["gen-task"]["llm_requests"]) == (2, 2, 2 + 1)
    # necessity + QS per task; weather: 2 x (doc, call, impl) + grouping + 1 merge, library: doc, call, impl
    assert (qa["validate-task"]["llm_requests"], qa["make-verifier"]["llm_requests"]) == (2 * 2, 8 + 3)
    assert (qa["validate-task"]["out"], qa["validate-task"]["pass"]) == (2, 1.0)
    assert (qa["make-verifier"]["out"], qa["make-verifier"]["pass"]) == (2, 1.0)
    assert qa["rollout replay"]["out"] == 2 and qa["rollout replay"]["llm_requests"] == 0
    assert (qa["verify f1 (replay)"]["out"], qa["verify f1 (replay)"]["pass"]) == (2, 1.0)
    # -n 2 trajectories per task; weather: 2 lookups + answer, library: 1 lookup + answer (per sample)
    assert (qa["rollout"]["in"], qa["rollout"]["out"], qa["rollout"]["llm_requests"]) == (2, 2, 2 * 3 + 2 * 2)
    assert (qa["verify f1"]["out"], qa["verify f1"]["pass"]) == (2, 1.0)
    rl = [json.loads(x) for x in (out / "rl.jsonl").read_text().splitlines()]
    assert len(rl) == 2 and all(len(r["trajectories"]) == 2 and r["env"]["backend"] == "python" for r in rl)
    f1 = [v["score"] for r in rl for v in r["verdicts"] if v["name"] == "f1"]
    assert len(f1) == 4 and f1 == pytest.approx([1.0] * 4)
    for f in ("tools.yield.txt", "qa.yield.txt", "graphs/notes.graph.json", "graphs/petstore.graph.json"):
        assert (out / f).stat().st_size > 0, f
