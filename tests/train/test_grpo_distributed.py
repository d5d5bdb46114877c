"""`grpo` on TRL's trainer across processes (`accelerate launch`, gloo on CPU), the loss gradients
through the trainer against an independent reference, and exact resume.

Every test name contains `distributed` so `pytest -k distributed` selects them. On a CPU-only machine
`accelerate launch --cpu --num_processes 2` starts ONE process (accelerate's simple launcher; CPU
multi-process needs an MPI hostfile), so the tests launch with `--multi_gpu`, which runs torchrun and
lets each process fall back to CPU + gloo; `use_cpu: true` in the recipe keeps the model on CPU.
"""

import json
import math
import os
import socket
import subprocess
import sys

import pytest

from tests.conftest import BIN, ROOT, requires_train
from tests.train.test_grpo import DONE, call_text, ticket_tasks
from toolkit.llm.testserver import ScriptedServer

pytestmark = requires_train

WRONG = "WRONGCODE"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def write_case(tmp_path, equal_steps=(), steps=6):
    """Tasks file, scripted completions (g0 right, g1 wrong; both right in `equal_steps`) and a recipe."""
    recs = ticket_tasks(tmp_path)
    (tmp_path / "tasks.jsonl").write_text("".join(r.model_dump_json(by_alias=True) + "\n" for r in recs))
    scripts = {}
    for r in recs:
        code = r.id[3:]
        for s in range(steps):
            scripts[f"{r.id}-s{s}-g0"] = [call_text("insert_ticket", {"code": code}), DONE]
            bad = code if s in equal_steps else WRONG
            scripts[f"{r.id}-s{s}-g1"] = [call_text("insert_ticket", {"code": bad}),
                                          DONE if s in equal_steps else f"Done: {WRONG}.<|im_end|>"]
    (tmp_path / "scripts.json").write_text(json.dumps(scripts))
    return recs


def recipe(tmp_path, **extra) -> str:
    body = {"use_cpu": True, "learning_rate": 0.001, "max_new_tokens": 32, "max_turns": 2, "tool_schema": "compact",
            "system_prompt": "drop", "generation": "scripted", "scripted_completions": str(tmp_path / "scripts.json"),
            "num_generations": 2, "tasks_per_step": 2, **extra}
    path = tmp_path / "r.json"
    path.write_text(json.dumps({"grpo": body}))
    return str(path)


def launch(tmp_path, tiny_model, out, nproc, args=(), env=None, timeout=240, **extra):
    grpo = os.path.join(BIN, "grpo") if os.path.exists(os.path.join(BIN, "grpo")) else "grpo"
    cmd = [grpo, "--model", tiny_model, "--output-dir", str(out), "--recipe", recipe(tmp_path, **extra),
           "-i", str(tmp_path / "tasks.jsonl"), *args]
    if nproc > 1:
        cmd = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", str(nproc),
               "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
               "--main_process_ip", "127.0.0.1", "--main_process_port", str(free_port()), *cmd]
    e = dict(os.environ)
    e.update({"PATH": f"{BIN}:{os.path.dirname(sys.executable)}:{e.get('PATH', '')}", "PYTHONPATH": str(ROOT),
              "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": "", **(env or {})})
    p = subprocess.run(cmd, check=False, capture_output=True, text=True, env=e, timeout=timeout, cwd=ROOT)
    assert p.returncode == 0, p.stderr[-4000:]
    assert p.stdout.strip() == ""  # stdout is for records; the trainer's logs go to stderr
    with open(out / "metrics.jsonl") as f:
        return [json.loads(x) for x in f]


# ----------------------------------------------------------------------------------------------
# every variant, two processes, rank 1 filters everything it rolled out


def _judge(req):
    ok = WRONG not in json.dumps(req["messages"])
    return json.dumps({"reasoning": "checked", "evidence": "calls", "task_success": ok, "confidence": 0.9})


@pytest.mark.parametrize("variant", [pytest.param("grpo", marks=pytest.mark.heavy),
                                     pytest.param("eigendata", marks=pytest.mark.heavy),
                                     pytest.param("astra", marks=pytest.mark.heavy), "ta-grpo", "simia"])
def test_distributed_variant_with_one_rank_filtered_empty(variant, tiny_model, tmp_path):
    # eigendata: at step 1 rank 0's only group is all-equal too, so the GLOBAL batch is empty; with
    # max_fill_rounds 1 the step runs zero-weight rows on both ranks and is counted as empty
    write_case(tmp_path, equal_steps=(0,) if variant == "eigendata" else ())
    extra = {"max_fill_rounds": 1} if variant == "eigendata" else {}
    args = ["--variant", variant, "--max-steps", "3"]
    with ScriptedServer(_judge) as srv:
        if variant == "simia":
            args += ["--judge-base-url", srv.base_url, "--judge-model", "scripted-model"]
        m = launch(tmp_path, tiny_model, tmp_path / "out", 2, args, env={"GRPO_TEST_FILTER_RANK": "1"}, **extra)
    assert [x["step"] for x in m] == [1, 2, 3]
    for x in m:  # both ranks rolled out and their groups are in the gathered metrics
        assert set(x["episodes_per_rank"]) == {"0", "1"} and all(v > 0 for v in x["episodes_per_rank"].values())
        assert x["forced_filtered"] >= 1
    if variant == "eigendata":
        assert not m[0]["trained"] and m[0]["empty_steps"] == 1 and m[0]["fill_bound_hit"] and m[0]["loss"] == 0
        assert m[1]["trained"] and m[2]["trained"] and m[2]["empty_steps"] == 1
    elif variant == "astra":  # n = 2 valid groups: rank 0 gives one per round, so two rounds per step
        assert all(x["trained"] and x["groups_trained"] == 2 and x["fill_rounds"] == 2 for x in m)
    else:
        assert all(x["trained"] and x["groups_trained"] == 1 and x["trained_tokens"] > 0 for x in m)
    if variant == "simia":
        assert m[0]["kl"] == pytest.approx(0.0, abs=1e-6) and m[2]["kl"] > 0


def test_distributed_one_vs_two_processes_same_loss_and_update(tiny_model, tmp_path):
    """Same global batch (2 tasks x G 2 per step, scripted completions): the loss per step and the
    final weights of a 2-process run equal the 1-process run's."""
    from safetensors.torch import load_file

    write_case(tmp_path)
    args = ["--variant", "astra", "--max-steps", "2"]  # dapo: one token normalizer over the whole batch
    one = launch(tmp_path, tiny_model, tmp_path / "one", 1, args)
    two = launch(tmp_path, tiny_model, tmp_path / "two", 2, args)
    assert [x["episodes_per_rank"] for x in two] == [{"0": 2, "1": 2}] * 2
    for a, b in zip(one, two):
        assert a["loss"] != 0 and b["loss"] == pytest.approx(a["loss"], rel=1e-5, abs=1e-7)
        assert a["trained_tokens"] == b["trained_tokens"]
    w0 = load_file(os.path.join(tiny_model, "model.safetensors"))
    w1, w2 = load_file(tmp_path / "one" / "model.safetensors"), load_file(tmp_path / "two" / "model.safetensors")
    moved = 0.0
    for k in w0:
        d1, d2 = w1[k] - w0[k], w2[k] - w0[k]
        moved = max(moved, float(d1.abs().max()))
        # Adam divides by sqrt(v): a coordinate whose gradient is ~1e-9 turns the all-reduce's different
        # summation order into a visible update difference, so the update is compared as a whole tensor
        assert float((d1 - d2).norm()) <= 1e-7 + 2e-3 * float(d1.norm()), k
    assert moved > 1e-5


# ----------------------------------------------------------------------------------------------
# the loss through the trainer vs an independent reference


def _reference_loss(model, groups, loss_type, max_tokens, advantage):
    """−Σ normalizer · A · ρ over policy tokens, ρ = exp(logp − logp.detach()), written from the papers'
    formulas (not from toolkit.train.advantages)."""
    import torch

    eps = [(gi, e) for gi, g in enumerate(groups) for e in g.items]
    n_groups = len(groups)
    loss = 0.0
    for gi, e in eps:
        rs = groups[gi].rewards
        mu = sum(rs) / len(rs)
        sd = math.sqrt(sum((r - mu) ** 2 for r in rs) / len(rs))
        a = (e.reward - mu) / sd if sd > 0 else 0.0
        ids = torch.tensor([e.ids])
        lp = torch.log_softmax(model(input_ids=ids).logits[0, :-1].float(), -1).gather(1, ids[0, 1:, None])[:, 0]
        ratio = torch.exp(lp - lp.detach())
        pos = [p - 1 for p, m in enumerate(e.mask) if m]
        turns = [e.turn_of[p + 1] for p in pos]
        n_i = len(pos)
        if loss_type == "turn_paper":  # ρ_it = π(y_it)/π_old(y_it): one ratio per turn, 1/G per trajectory
            for t in sorted(set(turns)):
                lt = sum(lp[p] for p, tt in zip(pos, turns) if tt == t)
                adv = a + min(e.turn_rewards[t], 0.0)
                loss = loss - adv * torch.exp(lt - lt.detach()) / (n_groups * len(groups[gi].items))
            continue
        for k, p in enumerate(pos):
            adv = a + min(e.turn_rewards[turns[k]], 0.0) if advantage == "ta_grpo" else a
            if loss_type == "grpo":
                w = 1.0 / (len(eps) * n_i)
            elif loss_type == "dapo":
                w = 1.0 / sum(x.policy_tokens for _, x in eps)
            elif loss_type == "group_token":
                w = 1.0 / (n_groups * sum(x.policy_tokens for x in groups[gi].items))
            elif loss_type == "dr_grpo":
                w = 1.0 / (len(eps) * max_tokens)
            else:  # turn: (1/#groups) (1/G) Σ_t token mean of turn t
                w = 1.0 / (n_groups * len(groups[gi].items) * turns.count(turns[k]))
            loss = loss - w * adv * ratio[p]
    return loss


def test_distributed_loss_gradients_match_reference_through_trainer(tiny_model, tmp_path):
    import asyncio

    import torch

    from tests.train.test_grpo import make_run
    from toolkit.train.grpo import batch as B

    recs = ticket_tasks(tmp_path, ["red", "blue"])
    scripts = {"tk-red-s0-g0": [call_text("insert_ticket", {"code": "red"}), DONE],
               "tk-red-s0-g1": [call_text("insert_ticket", {"code": "no"}), "I could not.<|im_end|>"],
               "tk-red-s0-g2": ["I will not.<|im_end|>"],
               "tk-blue-s0-g0": [call_text("insert_ticket", {"code": "blue"}), DONE],
               "tk-blue-s0-g1": [call_text("insert_ticket", {"code": "x"}), DONE],
               "tk-blue-s0-g2": [call_text("insert_ticket", {"code": "blue"}), DONE]}
    run = make_run(tiny_model, tmp_path, recs, scripts, num_generations=3)
    groups = [asyncio.run(run.rollouts.group(r, 0))[0] for r in recs]
    assert [g.rewards for g in groups] == [[1.0, 0.0, 0.0], [1.0, 0.0, 1.0]]
    groups[0].items[1].turn_rewards = [-0.25, 0.0]  # a dense penalty on turn 0 (TA-GRPO)
    model, tr = run.unwrapped, run.trainer
    for loss_type, advantage in [("grpo", "grpo"), ("dapo", "grpo"), ("bnpo", "grpo"), ("group_token", "grpo"),
                                 ("dr_grpo", "grpo"), ("turn", "ta_grpo"), ("turn_paper", "ta_grpo")]:
        run.opts.turn_ratio = "turn" if loss_type == "turn_paper" else "token"
        loss_type = "turn" if loss_type == "turn_paper" else loss_type
        run.opts.loss_type, run.opts.advantage = loss_type, advantage
        inputs = B.rows_to_tensors(B.global_rows(groups, run.opts), run.tok.pad_token_id, 1.0)
        model.zero_grad()
        tr._compute_loss(model, inputs).backward()
        got = [p.grad.clone() for p in model.parameters()]
        model.zero_grad()
        ref_type = {"bnpo": "dapo"}.get(loss_type, loss_type)
        if run.opts.turn_ratio == "turn":
            ref_type = "turn_paper"
        _reference_loss(model, groups, ref_type, run.opts.max_total_tokens, advantage).backward()
        for g, p in zip(got, model.parameters()):
            assert torch.allclose(g, p.grad, atol=2e-6, rtol=1e-4), loss_type
        assert max(float(g.abs().max()) for g in got) > 1e-4, loss_type


# ----------------------------------------------------------------------------------------------
# resume: the ASTRA buffer and the task position come back exactly


def test_distributed_resume_restores_buffer_and_data_position(tiny_model, tmp_path):
    from safetensors.torch import load_file

    from tests.train.test_grpo import make_run

    recs = ticket_tasks(tmp_path)
    scripts = {}
    for r in recs:  # "green" is always all-equal (invalid), the others valid: the buffer fills and drains
        code = r.id[3:]
        for s in range(5):
            scripts[f"{r.id}-s{s}-g0"] = [call_text("insert_ticket", {"code": code}), DONE]
            scripts[f"{r.id}-s{s}-g1"] = [call_text("insert_ticket", {"code": code if code == "green" else WRONG}), DONE]
    kw = {"num_generations": 2, "tasks_per_step": 2, "variant": "astra", "save_steps": 1}
    full = make_run(tiny_model, tmp_path / "a", recs, dict(scripts), max_steps=4, **kw)
    full.train()
    part = make_run(tiny_model, tmp_path / "b", recs, dict(scripts), max_steps=2, **kw)
    part.train()
    assert part.history[-1]["buffer"] == 1  # the checkpoint holds a non-empty buffer
    resumed = make_run(tiny_model, tmp_path / "b", recs, dict(scripts), max_steps=4, resume_from_checkpoint="auto", **kw)
    assert resumed.batcher.buffer == [] and resumed.drawn == 0
    resumed.train()
    # timings, and what async prefetching changes by design: the resumed first step re-rolls the
    # in-flight tasks synchronously (staleness 0), and tokens are counted when generated
    strip = ("rollout_s", "train_s", "trained_tokens_per_s", "gen_tokens_per_s", "staleness", "rollout_wait_s",
             "generated_tokens")
    same = lambda m: {k: v for k, v in m.items() if k not in strip}
    for a, b in zip([same(m) for m in resumed.history], [same(m) for m in full.history[2:]], strict=True):
        assert a == b, {k: (a.get(k), b.get(k)) for k in set(a) | set(b) if a.get(k) != b.get(k)}
    wa = load_file(tmp_path / "a" / "out" / "model.safetensors")
    wb = load_file(tmp_path / "b" / "out" / "model.safetensors")
    assert all(float((wa[k] - wb[k]).abs().max()) < 1e-6 for k in wa)
