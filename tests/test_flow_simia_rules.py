"""repair --strategy rules: scripted synthesizer texts (good and malformed) → simulate-env --mode trajectory
→ the rule post-process; kept trajectories validate and render in a Qwen2.5 chat template with tools."""

import json
from pathlib import Path

import jinja2
import pytest
from click.testing import CliRunner
from jinja2.sandbox import ImmutableSandboxedEnvironment
from simia_fixtures import EXPECTED, GOOD, POLICY, REPLIES, SEED, TOOLS

from toolkit import cli
from toolkit.envs.python import validate_arguments
from toolkit.flows.simia import format as F
from toolkit.flows.simia.rules import Dropped, clean_messages, tool_index
from toolkit.llm.testserver import ScriptedServer
from toolkit.schema import Record

NAMES = list(EXPECTED)
TEMPS = [round(0.05 * i, 2) for i in range(len(NAMES))]  # one pass per reply, keyed by its temperature
TEMPLATE = (Path(__file__).parent / "qwen25_template.jinja").read_text()


def render_chat(messages, tools=None, add_generation_prompt=False):
    """What transformers' apply_chat_template does with a chat template string (same Jinja settings)."""
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = lambda x, indent=None, separators=None, sort_keys=False: json.dumps(
        x, ensure_ascii=False, indent=indent, separators=separators, sort_keys=sort_keys)
    env.globals["raise_exception"] = lambda msg: (_ for _ in ()).throw(jinja2.TemplateError(msg))
    return env.from_string(TEMPLATE).render(messages=messages, tools=tools, add_generation_prompt=add_generation_prompt)


def trl_messages(traj):
    """TRL / HF chat-template shape: tool-call arguments as dicts."""
    out = []
    for m in traj["messages"]:
        m = {k: v for k, v in m.items() if v is not None}
        if m.get("tool_calls"):
            m["tool_calls"] = [{"type": "function", "function": {
                "name": tc["function"]["name"], "arguments": json.loads(tc["function"]["arguments"])}}
                for tc in m["tool_calls"]]
        out.append(m)
    return out


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("simia")
    recipe = tmp / "r.yaml"
    recipe.write_text("simulate-env:\n  temperatures: " + json.dumps(TEMPS) + "\n")
    by_temp = {t: REPLIES[n] for t, n in zip(TEMPS, NAMES)}
    with ScriptedServer(lambda req: by_temp[req["temperature"]]) as srv:
        r = CliRunner().invoke(cli.simulate_env, ["--mode", "trajectory", "-n", str(len(NAMES)), "--recipe", str(recipe),
                                                  "--base-url", srv.base_url, "--model", "scripted"],
                               input=json.dumps(SEED) + "\n")
    assert r.exit_code == 0, r.output
    sims = r.stdout
    rej = tmp / "rej.jsonl"
    r2 = CliRunner().invoke(cli.repair, ["--strategy", "rules", "--rejects", str(rej)], input=sims)
    kept = {json.loads(x)["id"]: json.loads(x) for x in r2.stdout.splitlines()}
    rejects = {json.loads(x)["id"]: json.loads(x) for x in rej.read_text().splitlines()} if rej.exists() else {}
    return r2, kept, rejects


def test_each_reply_is_repaired_or_dropped_with_the_right_reason(pipeline):
    r, kept, rejects = pipeline
    assert r.exit_code == 1  # some lines were rejected
    for k, name in enumerate(NAMES):
        rid = f"seed-1-sim{k}"
        outcome, what = EXPECTED[name]
        if outcome == "kept":
            assert rid in kept, (name, rejects.get(rid))
            t = kept[rid]["trajectories"][0]
            assert t["extra"]["simia"]["fixes"] == what, name
            v = [x for x in kept[rid]["verdicts"] if x["name"] == "simia_rules"]
            assert len(v) == 1 and v[0]["passed"] and v[0]["stage"] == "repair"
        else:
            assert rid not in kept and rid in rejects, name
            assert rejects[rid]["error"].startswith(what + ":"), (name, rejects[rid]["error"])


def test_kept_trajectories_validate_and_load_in_a_chat_template_with_tools(pipeline):
    _, kept, _ = pipeline
    assert len(kept) == sum(1 for o, _ in EXPECTED.values() if o == "kept")
    for rid, rec in kept.items():
        Record.model_validate(rec)  # the record schema
        t = rec["trajectories"][0]
        assert t["messages"][0] == {"role": "system", "content": POLICY, "tool_calls": None, "tool_call_id": None,
                                    "name": None, "reasoning_content": None}
        assert [m["role"] for m in t["messages"]].count("system") == 1
        assert "raw" not in t["extra"]["simia"] and t["error"] is None
        params = tool_index(TOOLS)
        calls = [tc for m in t["messages"] for tc in (m["tool_calls"] or [])]
        assert calls
        for tc in calls:
            assert validate_arguments(params[tc["function"]["name"]], json.loads(tc["function"]["arguments"])) is None
        text = render_chat(trl_messages(t), tools=[x["function"] for x in t["tools"]])
        assert "# Tools" in text and '"name": "cancel_reservation"' in text.split("<|im_end|>")[0]
        body = text.split("<|im_end|>\n", 1)[1]  # after the system turn (which explains the format)
        assert body.count("<tool_call>") == len(calls)
        assert body.count("<tool_response>") == sum(m["role"] == "tool" for m in t["messages"])
        assert "<function>" not in text and text.endswith("<|im_end|>\n")
    good = render_chat(trl_messages(kept["seed-1-sim0"]["trajectories"][0]), tools=[x["function"] for x in TOOLS])
    assert '<tool_call>\n{"name": "get_reservation", "arguments": {"reservation_id": "R9"}}\n</tool_call>' in good
    quoted = kept[f"seed-1-sim{NAMES.index('UNESCAPED_QUOTES')}"]["trajectories"][0]
    args = json.loads(quoted["messages"][2]["tool_calls"][0]["function"]["arguments"])
    assert args == {"reservation_id": 'R5 "moved"'}


def test_hermes_export_matches_the_template_rendering(pipeline):
    _, kept, _ = pipeline
    t = kept["seed-1-sim0"]["trajectories"][0]
    msgs = [{k: v for k, v in m.items() if v is not None} for m in t["messages"]]
    hermes = F.to_hermes(msgs, TOOLS)
    assert all(set(m) == {"role", "content"} for m in hermes)
    assert [m["role"] for m in hermes] == ["system", "user", "assistant", "user", "assistant", "user", "assistant"]
    assert '<tool_call>\n{"name": "get_reservation", "arguments": {"reservation_id": "R9"}}\n</tool_call>' in hermes[2]["content"]
    assert "<tool_response" in hermes[3]["content"]
    text = render_chat(hermes)  # plain ChatML, no tools argument: the text already carries them
    assert '{"name": "cancel_reservation", "arguments": {"reservation_id": "R9", "reason": "other"}}' in text
    # and back: the native form is recovered (ids renumbered)
    back = F.to_native(hermes)
    assert [m["role"] for m in back] == [m["role"] for m in msgs]
    assert [tc["function"] for m in back for tc in m.get("tool_calls") or []] == \
        [tc["function"] for m in msgs for tc in m.get("tool_calls") or []]


def test_system_prompt_replaced_by_the_deployments(tmp_path):
    sim = {"messages": [], "extra": {"simia": {"raw": GOOD, "system": POLICY}}}
    msgs, fixes = clean_messages(sim, tool_index(TOOLS), system_prompt="DEPLOYED PROMPT")
    assert msgs[0] == {"role": "system", "content": "DEPLOYED PROMPT"} and fixes == ["system_replaced"]
    rec = {"id": "x", "trajectories": [{"id": "x-t0", "tools": TOOLS, **sim}]}
    recipe = tmp_path / "r.yaml"
    (tmp_path / "sys.txt").write_text("FROM FILE")
    recipe.write_text(f"repair:\n  system_prompt_file: {tmp_path / 'sys.txt'}\n")
    r = CliRunner().invoke(cli.repair, ["--strategy", "rules", "--recipe", str(recipe)], input=json.dumps(rec) + "\n")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["trajectories"][0]["messages"][0]["content"] == "FROM FILE"


def test_native_hermes_text_trajectory_is_normalized():
    traj = {"messages": [
        {"role": "system", "content": "S"},
        {"role": "user", "content": "status of R1?"},
        {"role": "assistant", "content": '<tool_call>\n{"name": "get_reservation", "arguments": {"reservation_id": "R1"}}\n</tool_call>'},
        {"role": "user", "content": '<tool_response>\n{"status": "confirmed"}\n</tool_response>'},
        {"role": "assistant", "content": "Confirmed."}]}
    msgs, fixes = clean_messages(traj, tool_index(TOOLS))
    assert fixes == ["hermes_to_native"]
    assert [m["role"] for m in msgs] == ["system", "user", "assistant", "tool", "assistant"]
    assert msgs[2]["tool_calls"][0]["function"] == {"name": "get_reservation", "arguments": '{"reservation_id": "R1"}'}
    assert msgs[3] == {"role": "tool", "tool_call_id": "call_1", "name": "get_reservation", "content": '{"status": "confirmed"}'}


def test_multi_trajectory_record_keeps_the_good_ones():
    bad = {"id": "t-bad", "messages": [], "tools": TOOLS, "extra": {"simia": {"raw": REPLIES["UNKNOWN_TOOL"]}}}
    good = {"id": "t-good", "messages": [], "tools": TOOLS, "extra": {"simia": {"raw": GOOD}}}
    r = CliRunner().invoke(cli.repair, ["--strategy", "rules"],
                           input=json.dumps({"id": "m", "trajectories": [bad, good]}) + "\n")
    assert r.exit_code == 0
    rec = json.loads(r.stdout)
    assert [t["id"] for t in rec["trajectories"]] == ["t-good"]
    v = {x["trajectory_id"]: x for x in rec["verdicts"]}
    assert not v["t-bad"]["passed"] and v["t-bad"]["scores"]["dropped"] == "unknown_tool"
    assert v["t-good"]["passed"]


def test_clean_messages_raises_dropped_with_rule():
    with pytest.raises(Dropped) as e:
        clean_messages({"messages": [], "extra": {"simia": {"raw": REPLIES["SCHEMA_VIOLATION"]}}}, tool_index(TOOLS))
    assert e.value.rule == "schema_violation" and "reason" in e.value.detail
