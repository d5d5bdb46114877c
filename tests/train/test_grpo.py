"""`grpo` on the tiny offline model: real environments, verify rewards, token masks, variants."""

import json
import random
from pathlib import Path

import pytest

from tests.conftest import jsonl, requires_train, run_cmd
from toolkit.llm.testserver import ScriptedServer
from toolkit.schema import Record

pytestmark = requires_train

CPU = {"use_cpu": True, "learning_rate": 1e-3, "max_new_tokens": 64, "max_turns": 4,
       "tool_schema": "compact", "system_prompt": "drop", "max_total_tokens": 6000}

TICKETS = (Path(__file__).resolve().parents[1] / "data" / "tickets.yaml").read_text()  # one-table domain
CODES = ["red", "blue", "green", "gold"]
DONE = "Done.<|im_end|>"


def call_text(name, args):
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": args}) + "\n</tool_call><|im_end|>"


def ticket_tasks(tmp_path, codes=CODES):
    path = tmp_path / "tickets.yaml"
    path.write_text(TICKETS)
    return [Record.model_validate({
        "id": f"tk-{c}", "env": {"backend": "sqlite", "path": str(path)},
        "task": {"instruction": f"Open a ticket with code {c}.",
                 "ground_truth": {"actions": [{"name": "insert_ticket", "arguments": {"code": c}}]}}})
        for c in codes]


def airline(i):
    from toolkit import domains

    return Record.model_validate(domains.load_tasks("airline")[i])


def make_run(tiny_model, tmp_path, records, scripts, **cfg):
    from toolkit.train import grpo as G

    def factory(model, tok):
        gen = G.ScriptedGenerator(tok, scripts)
        gen.seen_prompts = []
        orig = gen.generate

        async def generate(ids, max_new, key=""):
            gen.seen_prompts.append((key, list(ids)))
            return await orig(ids, max_new, key=key)

        gen.generate = generate
        return gen

    return G.GRPORun({**CPU, "max_steps": 1, **cfg}, records, tiny_model, str(tmp_path / "out"), generator=factory)


def test_episode_calls_env_verify_rewards_and_masks(tiny_model, tmp_path):
    import asyncio

    rec = airline(0)  # cancel reservation 1003; user simulator answers over HTTP
    agent_turns = [call_text("update_reservation", {"reservation_id": 1003, "status": "cancelled"}),
                   "Done: 248 USD go back to your card and 50 USD to the certificate.<|im_end|>"]
    scripts = {f"{rec.id}-s0-g0": agent_turns, f"{rec.id}-s0-g1": ["I cannot help with that.<|im_end|>"]}

    def user(req):
        return "Thank you, that is all. ###STOP###"

    with ScriptedServer(user) as srv:
        run = make_run(tiny_model, tmp_path, [rec], scripts, num_generations=2, user_base_url=srv.base_url,
                       user_model="scripted-model")
        group, scored = asyncio.run(run.rollouts.group(rec, 0))
    good, bad = group.items
    # the environment really ran the call and verify's state_diff scored it
    assert good.traj.steps[0].name == "update_reservation" and good.traj.steps[0].ok
    assert '"status": "cancelled"' in good.traj.messages[3].content
    assert good.reward == 1.0 and bad.reward == 0.0
    assert scored.trajectories[0].scores["state_diff"]["R"] == 1
    assert [v.name for v in scored.verdicts] == ["state_diff", "state_diff"]
    assert good.traj.termination == "user_stop" and bad.traj.termination == "user_stop"
    tok = run.tok
    # policy tokens are exactly what was generated; tool results and user turns are masked
    policy = tok.decode([t for t, m in zip(good.ids, good.mask) if m])
    assert policy == "".join(agent_turns)
    context = tok.decode([t for t, m in zip(good.ids, good.mask) if not m])
    assert good.traj.messages[3].content in context and "that is all. ###STOP###" not in policy
    assert rec.task.instruction in context and rec.task.instruction not in policy
    # the token stream is the conversation: decoding it gives the chat template's rendering
    from toolkit.formats.tools import prepare_tools
    from toolkit.train import grpo as G
    from toolkit.train.export import prepare_system

    msgs = prepare_system([m.model_dump(exclude_none=True) for m in good.traj.messages[:-1]], "drop")
    rendered = tok.apply_chat_template(G.agent._render_copy(msgs), tools=prepare_tools(good.traj.tools, "compact"),
                                       tokenize=False)
    assert tok.decode(good.ids) + "\n" == rendered
    # no re-tokenization: turn 2 was sampled from the stream itself (prefix of the final ids)
    prompts = [ids for key, ids in run.generator.seen_prompts if key.endswith("g0")]
    assert len(prompts) == 2 and good.ids[: len(prompts[1])] == prompts[1]
    assert good.ids[: len(prompts[0])] == prompts[0] and good.prompt_len == len(prompts[0])
    # the user simulator saw the agent's text reply (rollout's LLMUser)
    assert any("248 USD" in json.dumps(r["messages"]) for r in srv.requests)


def test_ta_grpo_turn_penalty_token_by_token(tiny_model, tmp_path):
    import asyncio

    from toolkit.train import grpo as G

    rec = airline(1)  # reservation 1002 cannot be cancelled: the write is a POLICY_VIOLATION (r_t = -0.1)
    rec.task.user_scenario = None  # no user simulator: a text reply ends the episode
    scripts = {f"{rec.id}-s0-g0": [call_text("update_reservation", {"reservation_id": 1002, "status": "cancelled"}),
                                   "I am sorry, it cannot be cancelled.<|im_end|>"],
               f"{rec.id}-s0-g1": [call_text("query_reservation", {"reservation_id": 1002}),
                                   "It is basic economy: no cancellation.<|im_end|>"]}
    # verify's default no-write basis (a task whose reference only reads passes only without an
    # attempted write): the violating sample scores 0 even though its write was rolled back
    run0 = make_run(tiny_model, tmp_path / "basis", [rec], scripts, num_generations=2, variant="ta-grpo")
    group0, _ = asyncio.run(run0.rollouts.group(rec, 0))
    assert group0.items[0].traj.steps[0].error_code == "POLICY_VIOLATION"
    assert group0.rewards == [0.0, 1.0]
    # the turn penalty in isolation: state alone (no_write_basis off) gives both samples 1.0
    run = make_run(tiny_model, tmp_path, [rec], scripts, num_generations=2, variant="ta-grpo", no_write_basis=False)
    group, _ = asyncio.run(run.rollouts.group(rec, 0))
    viol, ok = group.items
    assert viol.traj.steps[0].error_code == "POLICY_VIOLATION"
    assert group.rewards == [1.0, 1.0]  # the violated write was rolled back: both end in the target state
    assert viol.turn_rewards == pytest.approx([-0.1, 0.0]) and ok.turn_rewards == pytest.approx([0.0, 0.0])
    items = G.sequence_advantages([group], run.opts)
    # A_i = 0 (equal rewards); A_it = A_i + min(r_t, 0): -0.1 on every token of turn 0, 0 on turn 1
    n0 = len(run.tok(scripts[f"{rec.id}-s0-g0"][0], add_special_tokens=False)["input_ids"])
    n1 = len(run.tok(scripts[f"{rec.id}-s0-g0"][1], add_special_tokens=False)["input_ids"])
    assert items[0][1] == pytest.approx([-0.1] * n0 + [0.0] * n1)
    assert items[1][1] == [0.0] * ok.policy_tokens
    # plain GRPO on the same group: nothing to learn (all advantages 0)
    run.opts.advantage = "grpo"
    assert all(a == 0 for it in G.sequence_advantages([group], run.opts) for a in it[1])
    # a training step with TA-GRPO (through TRL's trainer) moves the weights: only the penalized turn has signal
    run = make_run(tiny_model, tmp_path, [rec], scripts, num_generations=2, tasks_per_step=1, variant="ta-grpo",
                   max_steps=1)
    before = [p.detach().clone() for p in run.unwrapped.parameters()]
    run.train()
    m = run.history[0]
    assert m["trained"] and m["loss"] != 0.0 and m["groups_trained"] == 1
    assert any((a != b.detach()).any() for a, b in zip(before, run.unwrapped.parameters()))


def test_ta_grpo_penalizes_policy_violations_only_unless_told(tiny_model, tmp_path):
    """LOGIGEN eq. 4: r_t = -lambda_err when a call violates the policy. The ta-grpo preset keeps that
    rule: a call to an unknown tool earns no penalty (r_t = its progress, 0), a violating one -0.1;
    `penalize_invalid_calls: true` (the toolkit's earlier default) penalizes the unknown tool too."""
    import asyncio

    rec = airline(1)
    rec.task.user_scenario = None
    scripts = {f"{rec.id}-s0-g0": [call_text("frobnicate_reservation", {"reservation_id": 1002}), DONE],
               f"{rec.id}-s0-g1": [call_text("update_reservation", {"reservation_id": 1002, "status": "cancelled"}),
                                   DONE]}
    for extra, unknown_r in (({}, 0.0), ({"penalize_invalid_calls": True}, -0.1)):
        run = make_run(tiny_model, tmp_path / str(bool(extra)), [rec], scripts, num_generations=2,
                       variant="ta-grpo", **extra)
        assert run.opts.turn_ratio == "turn" and run.opts.max_staleness == 0
        group, _ = asyncio.run(run.rollouts.group(rec, 0))
        unknown, viol = group.items
        assert unknown.traj.steps[0].error_code == "UNKNOWN_TOOL"
        assert viol.traj.steps[0].error_code == "POLICY_VIOLATION"
        assert unknown.turn_rewards == pytest.approx([unknown_r, 0.0]), extra
        assert viol.turn_rewards == pytest.approx([-0.1, 0.0])


def _order(records, seed=0):
    order = list(records)
    random.Random(seed).shuffle(order)
    return order


def test_dynamic_filtering_drops_the_all_equal_group(tiny_model, tmp_path):

    recs = ticket_tasks(tmp_path, ["red", "blue"])
    right = lambda c: [call_text("insert_ticket", {"code": c}), DONE]
    wrong = [call_text("insert_ticket", {"code": "nope"}), DONE]
    scripts = {"tk-red-s0-g0": right("red"), "tk-red-s0-g1": right("red"),      # all pass -> dropped
               "tk-blue-s0-g0": right("blue"), "tk-blue-s0-g1": wrong}          # mixed -> kept
    run = make_run(tiny_model, tmp_path, recs, scripts, num_generations=2, tasks_per_step=2, variant="eigendata",
                   max_steps=1)
    run.train()
    m = run.history[0]
    assert m["groups"] == 2 and m["groups_trained"] == 1 and m["filtered_fraction"] == 0.5
    assert m["reward_mean"] == 0.75 and m["tool_calls"] == 4 and m["trained"]
    with open(tmp_path / "out" / "metrics.jsonl") as f:
        assert json.loads(f.readline())["groups_trained"] == 1
    # several policy updates per batch (TRL reuses the generation num_iterations times; ratios vs the
    # sampling-time log-probs), two gradient-accumulation slices
    run = make_run(tiny_model, tmp_path / "b", recs, scripts, num_generations=2, tasks_per_step=2, variant="eigendata",
                   max_steps=3, num_iterations=3, gradient_accumulation_steps=2, micro_batch=2)
    run.train()
    assert [m["step"] for m in run.history] == [1, 2, 3]
    assert run.history[0]["groups_trained"] == 1 and run.history[1].get("reused_rollouts")
    assert all(0.0 <= m["clip_fraction"] <= 1.0 for m in run.history) and run.history[2]["clip_fraction"] >= 0.0


def test_adaptive_batch_filling_keeps_the_batch_full_from_the_buffer(tiny_model, tmp_path):

    recs = ticket_tasks(tmp_path)
    order = _order(recs)  # the task order GRPORun draws (seeded)
    valid = lambda r: [call_text("insert_ticket", {"code": r.id[3:]}), call_text("insert_ticket", {"code": "x"})]
    same = lambda r: [call_text("insert_ticket", {"code": r.id[3:]})] * 2
    kinds = [valid, same, valid, valid]  # round 1: 1 valid (buffered); round 2: 2 valid -> batch of n=2
    scripts = {}
    for r, kind in zip(order, kinds):
        for k, text in enumerate(kind(r)):
            scripts[f"{r.id}-s0-g{k}"] = [text, DONE]
    run = make_run(tiny_model, tmp_path, recs, scripts, num_generations=2, tasks_per_step=2, variant="astra",
                   max_steps=1)
    run.train()
    m = run.history[0]
    assert m["fill_rounds"] == 2 and m["groups"] == 4 and m["groups_trained"] == 2
    assert m["from_buffer"] == 1 and m["buffer"] == 1  # one valid group carried over to the next step
    assert [g.key for g in run.batcher.buffer] == [order[3].id]
    assert m["filtered_fraction"] == 0.25


def test_grpo_cli_real_generation_checkpoint_and_resume(tiny_model, tmp_path):
    recs = ticket_tasks(tmp_path)
    stdin = jsonl([r.model_dump(mode="json", by_alias=True) for r in recs])
    out = tmp_path / "g"
    recipe = tmp_path / "r.yaml"
    recipe.write_text("grpo:\n  max_new_tokens: 16\n  max_turns: 2\n  save_steps: 1\n  tool_schema: compact\n"
                      "  system_prompt: drop\n  use_cpu: true\n  learning_rate: 0.001\n  beta: 0.01\n")
    args = ["grpo", "--model", tiny_model, "--output-dir", str(out), "--recipe", str(recipe), "--group-size", "2",
            "--tasks-per-step", "2", "--variant", "grpo", "--rollouts", str(tmp_path / "roll.jsonl")]
    p = run_cmd(args + ["--max-steps", "2"], stdin=stdin, env={"OMP_NUM_THREADS": "1"}, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    assert (out / "model.safetensors").exists() and (out / "checkpoint-2" / "optimizer.pt").exists()
    assert (out / "checkpoint-2" / "toolkit_grpo_state.pkl").exists()
    with open(out / "metrics.jsonl") as f:
        m = [json.loads(x) for x in f]
    assert [x["step"] for x in m] == [1, 2]
    for key in ("reward_mean", "reward_std", "filtered_fraction", "buffer", "turns_mean", "tool_errors",
                "gen_tokens_per_s", "kl"):
        assert key in m[-1]
    assert m[-1]["policy_tokens"] > 0 and m[-1]["episodes"] == 4
    rolled = [json.loads(x) for x in (tmp_path / "roll.jsonl").read_text().splitlines()]
    assert len(rolled) == 4 and all(len(r["trajectories"]) == 2 for r in rolled)
    assert all(v["name"] == "state_diff" for r in rolled for v in r["verdicts"])
    p = run_cmd(args + ["--max-steps", "3", "--resume-from-checkpoint", "auto"], stdin=stdin,
                env={"OMP_NUM_THREADS": "1"}, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    assert '"resumed_from": "' in p.stderr and "checkpoint-2" in p.stderr
    with open(out / "metrics.jsonl") as f:
        assert [json.loads(x)["step"] for x in f] == [1, 2, 3]


def test_usage_errors(tmp_path):
    p = run_cmd(["grpo", "--output-dir", str(tmp_path)], stdin="")
    assert p.returncode == 2 and "--model PATH" in p.stderr
    p = run_cmd(["grpo", "--model", "x", "--output-dir", str(tmp_path), "--group-size", "1"], stdin="")
    assert p.returncode == 2 and "num_generations" in p.stderr
    # greedy groups are one sample G times: refused before the (absent) model is opened
    r = tmp_path / "r.json"
    r.write_text(json.dumps({"defaults": {"temperature": 0.0}}))
    p = run_cmd(["grpo", "--model", str(tmp_path / "no-such-model"), "--output-dir", str(tmp_path / "o"),
                 "--recipe", str(r)], stdin="")
    assert p.returncode == 2 and "temperature must be > 0" in p.stderr and "no-such-model" not in p.stderr


def test_vllm_usage_errors_before_any_model_loads(tmp_path):
    """generation vllm: an unreachable server (short timeout), colocate without a GPU and vllm not
    installed are usage errors (exit 2) raised before the model path is even opened."""
    import importlib.util
    import socket
    import time

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed once the block ends: nothing listens there

    def grpo(body):
        r = tmp_path / "r.json"
        r.write_text(json.dumps({"grpo": {"generation": "vllm", **body}}))
        t0 = time.time()
        p = run_cmd(["grpo", "--model", str(tmp_path / "no-such-model"), "--output-dir", str(tmp_path / "o"),
                     "--recipe", str(r)], stdin="", env={"CUDA_VISIBLE_DEVICES": ""})
        return p, time.time() - t0

    p, dt = grpo({"vllm_server_port": port, "vllm_server_timeout": 2})
    assert p.returncode == 2 and "unreachable" in p.stderr and f":{port}/health/" in p.stderr, p.stderr[-2000:]
    assert "no-such-model" not in p.stderr and dt < 60
    p, _ = grpo({"vllm_mode": "colocate"})
    assert p.returncode == 2 and "needs a GPU" in p.stderr, p.stderr[-2000:]
    if importlib.util.find_spec("vllm") is None:
        with ScriptedServer(lambda req: "ok") as srv:  # something answers on the port
            port = int(srv.base_url.rsplit(":", 1)[1].split("/")[0])
            p, _ = grpo({"vllm_server_port": port})
        assert p.returncode == 2 and "needs the vllm package" in p.stderr, p.stderr[-2000:]


def test_simia_rl_simulated_env_and_llm_reward(tiny_model, tmp_path):
    """Simia-RL: the environment is an LLM (simulate-env's role) and the reward an LLM judge (Simia
    rubric), both over loopback HTTP; KL to the reference model (beta 0.001) and clip-high 0.28."""

    rec = Record.model_validate({
        "id": "sim-1", "env": {"backend": "simulated", "config": {
            "policy": "Answer questions about the documents.",
            "tools": [{"type": "function", "function": {
                "name": "search_docs", "description": "Search the documents.",
                "parameters": {"type": "object", "properties": {"query": {"type": "string"}},
                               "required": ["query"]}}}]}},
        "task": {"instruction": "What is the refund window?"}})
    good = [call_text("search_docs", {"query": "refund"}), "ANSWER: 30 days.<|im_end|>"]
    bad = ["I do not know.<|im_end|>"]
    scripts = {f"sim-1-s{s}-g{k}": (good if k == 0 else bad) for s in (0, 1) for k in (0, 1)}

    def llm(req):
        if "You simulate tool execution" in (req["messages"][0].get("content") or ""):
            return json.dumps({"success": True, "observation": {"hits": ["Refunds are accepted for 30 days."]}})
        ok = "ANSWER: 30 days" in json.dumps(req["messages"])
        return json.dumps({"reasoning": "checked", "evidence": "final answer", "task_success": ok,
                           "confidence": 0.9})

    with ScriptedServer(llm) as srv:
        run = make_run(tiny_model, tmp_path, [rec], scripts, num_generations=2, tasks_per_step=1, variant="simia",
                       env_base_url=srv.base_url, judge_base_url=srv.base_url, judge_model="scripted-model",
                       rollouts=str(tmp_path / "roll.jsonl"))
        assert run.opts.beta == 0.001 and run.opts.eps_high == 0.28 and run.ref is not None
        run.trainer.args.max_steps = 2
        run.train()
        m1, m2 = run.history
    assert m1["reward_mean"] == 0.5 and m2["reward_mean"] == 0.5
    assert m1["kl"] == pytest.approx(0.0, abs=1e-6) and m2["kl"] > 0  # the policy moved away from the reference
    rolled = [json.loads(x) for x in (tmp_path / "roll.jsonl").read_text().splitlines()]
    traj = rolled[0]["trajectories"][0]
    assert "Refunds are accepted for 30 days." in traj["messages"][3]["content"]  # the simulated env answered
    verdicts = rolled[0]["verdicts"]
    assert [(v["kind"], v["name"], v["passed"]) for v in verdicts] == [("llm", "judge", True), ("llm", "judge", False)]


def test_strict_tool_calls_never_repair_malformed_json(tiny_model, tmp_path):
    import asyncio

    from toolkit.train import grpo as G

    assert G.agent._strictly_valid(call_text("insert_ticket", {"code": "red"}))
    assert not G.agent._strictly_valid("<tool_call>\n{'name': 'insert_ticket', 'arguments': {'code': 'red'}}\n</tool_call>")
    assert not G.agent._strictly_valid('<tool_call>\n{"name": "insert_ticket", "arguments": "{}"}\n</tool_call>')
    recs = ticket_tasks(tmp_path, ["red"])
    sloppy = "<tool_call>\n{'name': 'insert_ticket', 'arguments': {'code': 'red'}}\n</tool_call><|im_end|>"
    scripts = {f"tk-red-s0-g{k}": [sloppy, DONE] for k in (0, 1)}
    lenient = make_run(tiny_model, tmp_path, recs, dict(scripts), num_generations=2)
    g, _ = asyncio.run(lenient.rollouts.group(recs[0], 0))
    assert g.rewards == [1.0, 1.0]  # the toolkit's parser repairs the quotes and the call runs
    strict = make_run(tiny_model, tmp_path, recs, dict(scripts), num_generations=2, strict_tool_calls=True)
    g, _ = asyncio.run(strict.rollouts.group(recs[0], 0))
    assert g.rewards == [0.0, 0.0] and all(e.format_errors == 1 and not e.traj.steps for e in g.items)


def test_async_behaviour_copy_samples_its_own_weights(tiny_model, tmp_path):
    """max_staleness > 0: the behaviour copy must not share TRL's patched forward with the training
    model (its closure would sample from the live weights while they are being updated)."""
    import torch

    from toolkit.train import grpo as G

    run = G.GRPORun({**CPU, "max_steps": 1, "max_staleness": 1}, ticket_tasks(tmp_path, ["red"]), tiny_model,
                    str(tmp_path / "out"))
    ids = torch.tensor([[5, 6, 7, 8]])
    with torch.no_grad():
        before = run.behaviour(input_ids=ids).logits.clone()
        for p in run.unwrapped.parameters():
            p.add_(0.5)
        assert torch.equal(run.behaviour(input_ids=ids).logits, before)  # untouched by the training weights
        run.behaviour.load_state_dict(run.behaviour_snapshot())  # the prefetch loads a snapshot when it starts
        assert torch.allclose(run.behaviour(input_ids=ids).logits, run.unwrapped(input_ids=ids).logits, atol=1e-5)


def test_shared_prefix_logps_and_gradients_equal_the_per_row_forward(tiny_model, tmp_path):
    """shared_prefix (auto with one process): the rows' common prefix is forwarded once and its KV
    cache repeated; the log-probs and the loss gradient equal the per-row forward's."""
    import asyncio

    import torch

    from toolkit.train.grpo import batch as B
    from toolkit.train.prefix import prefix_len

    recs = ticket_tasks(tmp_path, ["red", "blue"])
    scripts = {"tk-red-s0-g0": [call_text("insert_ticket", {"code": "red"}), DONE],
               "tk-red-s0-g1": ["I will not.<|im_end|>"],
               "tk-blue-s0-g0": [call_text("insert_ticket", {"code": "x"}), DONE],
               "tk-blue-s0-g1": [call_text("insert_ticket", {"code": "blue"}), "All set, blue.<|im_end|>"]}
    run = make_run(tiny_model, tmp_path, recs, scripts, num_generations=2, variant="ta-grpo")
    groups = [asyncio.run(run.rollouts.group(r, 0))[0] for r in recs]
    inputs = B.rows_to_tensors(B.global_rows(groups, run.opts), run.tok.pad_token_id, 1.0)
    ids, att, pm = inputs["input_ids"], inputs["attention_mask"], inputs["policy_mask"]
    P = prefix_len(ids, att, pm)
    first_policy = min(int(r.nonzero()[0]) + 1 for r in pm)
    assert 64 <= P < first_policy and (ids[:, : P + 1] == ids[:1, : P + 1]).all()
    model, tr = run.unwrapped, run.trainer
    assert tr._shared_prefix_ok()
    grads = {}
    for shared in (True, False):
        run.opts.shared_prefix = shared
        model.zero_grad()
        with torch.no_grad():
            lp = tr._logps(model, ids, att, pm)
        loss = tr._compute_loss(model, inputs)
        loss.backward()
        grads[shared] = ([p.grad.clone() for p in model.parameters()], lp * pm, float(loss.detach()))
    (g1, lp1, l1), (g0, lp0, l0) = grads[True], grads[False]
    assert torch.allclose(lp1, lp0, atol=1e-5) and abs(l1 - l0) < 1e-6
    assert all(torch.allclose(a, b, atol=1e-6, rtol=1e-4) for a, b in zip(g1, g0))
    assert max(float(g.abs().max()) for g in g1) > 1e-4
    assert prefix_len(ids[:1], att[:1], pm[:1]) == 0  # one row: nothing to share


def test_zero_advantage_rows_skip_the_forward_and_step_the_same(tiny_model, tmp_path, monkeypatch):
    """A slice whose every advantage is 0 (an all-equal group, no KL) has an exactly zero gradient:
    its forward is skipped (counted in zero_gradient_rows), and the weights after the step equal
    those of the run that forwards it."""
    import torch

    from toolkit.train.grpo import trainer as T

    recs = ticket_tasks(tmp_path, ["red", "blue"])
    right = lambda c: [call_text("insert_ticket", {"code": c}), DONE]
    wrong = [call_text("insert_ticket", {"code": "nope"}), DONE]
    scripts = {"tk-red-s0-g0": right("red"), "tk-red-s0-g1": right("red"),      # all pass: advantages 0
               "tk-blue-s0-g0": right("blue"), "tk-blue-s0-g1": wrong}          # mixed: trained

    def run(skip, sub):
        monkeypatch.setattr(T, "SKIP_ZERO_ADVANTAGE", skip)
        r = make_run(tiny_model, tmp_path / sub, recs, scripts, num_generations=2, tasks_per_step=2, variant="grpo",
                     max_steps=1, gradient_accumulation_steps=2, seed=3)
        r.train()
        return r.history[0], {k: v.detach().clone() for k, v in r.unwrapped.state_dict().items()}

    m_skip, w_skip = run(True, "skip")
    m_full, w_full = run(False, "full")
    assert m_skip["zero_gradient_rows"] == 2 and m_full["zero_gradient_rows"] == 0
    assert m_skip["groups_trained"] == m_full["groups_trained"] == 2
    assert m_skip["trained_tokens"] == m_full["trained_tokens"] > 0
    base = make_run(tiny_model, tmp_path / "base", recs, scripts, num_generations=2, tasks_per_step=2,
                    variant="grpo", max_steps=1).unwrapped.state_dict()
    assert any(not torch.equal(base[k], w_full[k]) for k in w_full)  # the mixed group did move the weights
    for k in w_full:
        assert torch.allclose(w_skip[k], w_full[k], rtol=0, atol=1e-7), k


def test_steps_without_signal_do_not_move_the_weights(tiny_model, tmp_path):
    """Step 1 trains a mixed group; steps 2-3 draw groups whose episodes all pass (advantages 0, no
    KL). With `empty_steps: skip` (the default) those steps are no optimizer update: the weights stay
    those after step 1. With `step` (TRL's behaviour) Adam's moments keep moving them."""
    import torch

    recs = ticket_tasks(tmp_path, ["red"])
    right, wrong = [call_text("insert_ticket", {"code": "red"}), DONE], [call_text("insert_ticket", {"code": "x"}), DONE]
    scripts = {"tk-red-s0-g0": right, "tk-red-s0-g1": wrong,
               **{f"tk-red-s{s}-g{g}": right for s in (1, 2) for g in (0, 1)}}

    def run(sub, steps, mode):
        r = make_run(tiny_model, tmp_path / sub, recs, scripts, num_generations=2, tasks_per_step=1,
                     variant="grpo", max_steps=steps, empty_steps=mode, learning_rate=1e-3, seed=5)
        r.train()
        return r.history, {k: v.detach().clone() for k, v in r.unwrapped.state_dict().items()}

    h1, w1 = run("one", 1, "skip")
    h3, w3 = run("skip", 3, "skip")
    hs, ws = run("step", 3, "step")
    assert [m["update_skipped"] for m in h3] == [False, True, True]
    assert [m["update_skipped"] for m in hs] == [False, False, False]
    assert [m["groups_trained"] for m in h3] == [1, 1, 1] and h3[1]["reward_std"] == 0
    for k in w1:
        assert torch.equal(w1[k], w3[k]), k
    assert any(not torch.allclose(w1[k], ws[k], rtol=0, atol=1e-6) for k in w1)  # momentum moved them
