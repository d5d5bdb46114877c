"""The learn experiment's data steps: the split by target/entities and the report's numbers."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.conftest import BIN, ROOT
from toolkit.train import learn as L


def _task(tid, target, **ids):
    return {"id": tid, "task": {"ground_truth": {"target_state_ref": target, "actions": [
        {"name": "update_x", "arguments": dict(ids, note="free text")}]}}}


def test_split_keeps_targets_and_entities_disjoint():
    tasks = [_task("a", "T1", user_id="u1"), _task("b", "T2", user_id="u2"), _task("c", "T1", user_id="u3"),
             _task("d", "T3", user_id="u1", reservation_id=5), _task("e", "T4", user_id="u4"),
             _task("f", "T5", user_id="u5", reservation_id=5)]
    for seed in range(5):
        train, held, dropped = L.split(tasks, 0.34, seed)
        assert len(held) == 2 and len(train) + len(held) + len(dropped) == 6
        hk = set().union(*(L.task_keys(t) for t in held))
        for t in train:
            assert not (L.task_keys(t) & hk), (seed, t["id"])
        # a dropped task shares a key with the held-out set (that is the only reason to drop it)
        for t in dropped:
            assert L.task_keys(t) & hk
    assert L.task_keys(tasks[3]) == {"target:T3", "entity:user_id=u1", "entity:reservation_id=5"}


def test_split_on_a_sqlite_domain_shares_catalogue_rows_only():
    """airline: flights, payment methods, the clock and the audit log have no agent insert/update tool: catalogue
    (shared_args); customers and reservations are the tasks' own entities. With the held-out set
    gathered around few entities, train keeps most tasks, and no customer or reservation is on both
    sides."""
    env = {"backend": "sqlite", "id": "airline"}
    assert L.shared_args({"env": env}) == {"flight_id", "payment_id", "clock_id", "log_id"}
    assert L.shared_args({"env": {"backend": "tau2", "domain": "airline"}}) == set()
    tasks = []
    for i, (user, res, flight) in enumerate([("u1", 1, "F1"), ("u1", 1, "F2"), ("u2", 2, "F1"), ("u2", 2, "F2"),
                                             ("u3", 3, "F1"), ("u3", 3, "F2"), ("u4", 4, "F1"), ("u4", 4, "F2")]):
        t = _task(f"t{i}", f"T{i}", user_id=user, reservation_id=res, flight_id=flight)
        t["env"] = env
        tasks.append(t)
    train, held, dropped = L.split(tasks, 0.25, 3)
    # every task names F1 or F2: with flights as entities nothing could be trained on
    assert len(held) == 2 and len(train) == 6 and not dropped
    held_users = {t["task"]["ground_truth"]["actions"][0]["arguments"]["user_id"] for t in held}
    assert len(held_users) == 1  # gathered: the second held-out task adds no new customer
    assert not held_users & {t["task"]["ground_truth"]["actions"][0]["arguments"]["user_id"] for t in train}
    # a cap on the held-out set: train loses only what shares a key with the tasks really held out
    train, held, dropped = L.split(tasks, 0.5, 3, max_heldout=1)
    assert (len(held), len(train), len(dropped)) == (1, 6, 1)


def test_split_mixes_the_held_out_signatures():
    """One customer's same-kind tasks add the fewest new keys; without stratification the held-out
    set is all that kind (airline seed 7: 15 of 20 new reservations), with it the kinds alternate."""
    def t(tid, name, **ids):
        r = _task(tid, f"T-{tid}", **ids)
        r["task"]["ground_truth"]["actions"][0]["name"] = name
        return r

    tasks = [t("a1", "update_x", user_id="u1"), t("a2", "update_x", user_id="u1"), t("a3", "update_x", user_id="u1"),
             t("b1", "insert_y", user_id="u1", reservation_id=1), t("c1", "update_x", user_id="u2"),
             t("d1", "insert_y", user_id="u3", reservation_id=2)]
    for seed in range(6):
        _, held, _ = L.split(tasks, 0.34, seed, stratify=False)
        assert [L.signature(h) for h in held] == [("update_x",), ("update_x",)], seed
        train, held, dropped = L.split(tasks, 0.34, seed)
        assert sorted(L.signature(h) for h in held) == [("insert_y",), ("update_x",)], seed
        hk = set().union(*(L.task_keys(h) for h in held))
        assert not any(L.task_keys(x) & hk for x in train) and len(train) + len(held) + len(dropped) == 6


def _traj(task_reward_turns):
    tid, reward, noop, turns = task_reward_turns
    msgs = [{"role": "user", "content": "hi"}]
    steps = []
    for i, kind in enumerate(turns):  # "ok" call, "bad" call (unknown tool), "text" reply
        if kind == "text":
            msgs.append({"role": "assistant", "content": "done"})
            continue
        msgs.append({"role": "assistant", "content": None, "tool_calls": [
            {"id": f"c{i}", "type": "function", "function": {"name": "f", "arguments": "{}"}}]})
        steps.append({"tool_call_id": f"c{i}", "name": "f", "ok": kind == "ok",
                      "error_code": None if kind == "ok" else "UNKNOWN_TOOL"})
    return {"id": tid, "trajectories": [{"id": f"{tid}-t0", "messages": msgs, "steps": steps, "reward": reward,
                                         "agent_model": "m", "scores": {"state_diff": {"R": int(reward),
                                                                                       "noop_target": noop}}}]}


def test_report_numbers_and_summary_shape(tmp_path):
    base = [_traj(x) for x in [("t1", 0.0, False, ["bad", "text"]), ("t2", 1.0, True, ["text"]),
                                ("t3", 0.0, False, ["text"])]]
    sft = [_traj(x) for x in [("t1", 1.0, False, ["ok", "text"]), ("t2", 1.0, True, ["ok", "text"]),
                               ("t3", 0.0, False, ["ok", "bad", "text"])]]
    for name, recs in (("base", base), ("sft", sft)):
        (tmp_path / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    s = L.report({"base": str(tmp_path / "base.jsonl"), "sft": str(tmp_path / "sft.jsonl")}, str(tmp_path / "out"))
    # by hand: base valid turns 0 of 4 (the one call named an unknown tool), sft 3 of 7
    assert s["base"] == {"n": 3, "reward_mean": 1 / 3, "pass_rate": 1 / 3, "valid_tool_call_rate": 0.0,
                         "forbidden_write_rate": 0.0}
    assert s["sft"]["valid_tool_call_rate"] == 3 / 7 and s["sft"]["reward_mean"] == 2 / 3
    d = s["sft_vs_base"]
    assert abs(d["diff"] - 1 / 3) < 1e-9 and d["ci_low"] <= d["diff"] <= d["ci_high"]
    assert 0.0 <= d["ci_low"] and d["ci_high"] <= 1.0  # per-task diffs are 1, 0, 0
    assert set(s) == {"base", "sft", "sft_vs_base"}
    on_disk = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert on_disk == json.loads(json.dumps(s))
    det = json.loads((tmp_path / "out" / "details.json").read_text())["models"]
    assert det["base"]["noop_passes"] == 1 and det["base"]["passes"] == 1  # its one pass changed nothing
    assert "| base | 3 |" in (tmp_path / "out" / "table.md").read_text()


def test_report_counts_passes_per_kind_of_task(tmp_path):
    """details.json and the table say which kinds of task (action signatures) each model passes."""
    def rec(tid, names, reward):
        r = _traj((tid, reward, False, ["ok", "text"]))
        r["task"] = {"ground_truth": {"actions": [{"name": n, "arguments": {}} for n in names]}}
        return r

    sft = [rec("a", ["q", "insert_x"], 1.0), rec("b", ["q", "insert_x"], 0.0), rec("c", ["q", "update_y"], 1.0)]
    (tmp_path / "sft.jsonl").write_text("".join(json.dumps(r) + "\n" for r in sft))
    L.report({"sft": str(tmp_path / "sft.jsonl")}, str(tmp_path / "out"))
    det = json.loads((tmp_path / "out" / "details.json").read_text())["models"]["sft"]
    assert det["by_signature"] == {"q > insert_x": {"n": 2, "passes": 1}, "q > update_y": {"n": 1, "passes": 1}}
    table = (tmp_path / "out" / "table.md").read_text()
    assert "| q > insert_x | 1/2 |" in table and "| q > update_y | 1/1 |" in table


def test_report_forbidden_writes_per_kind_and_paired_diffs_per_signature(tmp_path):
    """Attempted forbidden writes (POLICY_VIOLATION calls) are counted per model and per LOGIGEN kind
    of task; the paired differences are repeated within each kind of task."""
    def rec(tid, kind, reward, codes):
        r = _traj((tid, reward, False, ["text"]))
        t = r["trajectories"][0]
        for i, code in enumerate(codes):
            t["messages"].insert(1, {"role": "assistant", "content": None, "tool_calls": [
                {"id": f"x{i}", "type": "function", "function": {"name": "update_x", "arguments": "{}"}}]})
            t["steps"].append({"tool_call_id": f"x{i}", "name": "update_x", "ok": code is None, "error_code": code})
        r["task"] = {"complexity": {"violation": {"rule": "r"}} if kind == "v" else {},
                     "ground_truth": {"actions": [{"name": "update_x" if kind == "v" else "q", "arguments": {}}]}}
        return r

    sft = [rec("a", "v", 0.0, ["POLICY_VIOLATION", "POLICY_VIOLATION"]), rec("b", "v", 1.0, []),
           rec("c", "p", 1.0, [None])]
    grpo = [rec("a", "v", 1.0, []), rec("b", "v", 1.0, []), rec("c", "p", 0.0, ["INVALID_ARGUMENTS"])]
    for name, recs in (("sft", sft), ("grpo", grpo)):
        (tmp_path / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    s = L.report({"sft": str(tmp_path / "sft.jsonl"), "grpo": str(tmp_path / "grpo.jsonl")}, str(tmp_path / "out"))
    assert s["sft"]["forbidden_write_rate"] == 1 / 3 and s["grpo"]["forbidden_write_rate"] == 0.0
    det = json.loads((tmp_path / "out" / "details.json").read_text())
    assert det["models"]["sft"]["forbidden_calls"] == 2  # an invalid call is not a forbidden write
    assert det["models"]["sft"]["by_kind"]["violation-first"] == {"n": 2, "passes": 1, "forbidden_episodes": 1}
    by_sig = det["diffs_by_kind"]["signature"]
    assert by_sig["update_x"]["grpo_vs_sft"]["diff"] == 0.5 and by_sig["q"]["grpo_vs_sft"]["diff"] == -1.0
    table = (tmp_path / "out" / "table.md").read_text()
    assert "| violation-first | 1/2 | 2/2 | +0.50 [" in table


def test_training_curve_quarters(tmp_path):
    rewards = [0.0, 0.25, 0.25, 0.5, 0.5, 0.5, 0.75, 1.0]
    (tmp_path / "metrics.jsonl").write_text("".join(
        json.dumps({"step": i + 1, "reward_mean": r, "success_rate": r / 2}) + "\n" for i, r in enumerate(rewards)))
    t = L.training_curve(str(tmp_path))
    assert t["steps"] == 8 and t["reward_first_quarter"] == 0.125 and t["reward_last_quarter"] == 0.875
    assert t["success_last_quarter"] == 0.4375
    assert L.training_curve(str(tmp_path / "nothing")) is None


def test_exclude_drops_tasks_sharing_a_key():
    tasks = [_task("a", "T1", user_id="u1"), _task("b", "T2", user_id="u2"), _task("c", "T9", user_id="u9")]
    others = [_task("x", "T2", user_id="u7"), _task("y", "T8", user_id="u1")]
    kept, dropped = L.exclude(tasks, others)
    assert [t["id"] for t in kept] == ["c"] and [t["id"] for t in dropped] == ["a", "b"]


def test_principals_are_new_consistent_and_loadable():
    """airline: the customers are replaced by clones with recombined names mapped into the id and the
    e-mail, new digits, their payment methods / reservations / payments cloned with remapped
    references; the state loads (checked inside) and no original customer, payment method or
    reservation id is left."""
    from toolkit.envs.sqlite import SqliteEnvironment
    from toolkit.train.principals import add_principals, principal_table

    env = SqliteEnvironment.from_ref({"backend": "sqlite", "id": "airline"})
    base = env.snapshot()
    assert principal_table(env.domain) == "customer"
    env.close()
    state, info = add_principals({"backend": "sqlite", "id": "airline"}, 12, seed=3)
    custs = state["customer"]
    assert len(custs) == 12 and info["principal_table"] == "customer"
    old_ids = {c["user_id"] for c in base["customer"]}
    firsts = {c["first_name"] for c in base["customer"]}
    lasts = {c["last_name"] for c in base["customer"]}
    names = set()
    for c in custs:
        assert c["user_id"] not in old_ids and c["first_name"] in firsts and c["last_name"] in lasts
        first, last, digits = c["user_id"].split("_")
        assert (first, last) == (c["first_name"].lower(), c["last_name"].lower()) and len(digits) == 4
        assert c["email"].startswith(f"{first}.")  # emma.w@ → mia.w@: the words it holds are mapped
        names.add((c["first_name"], c["last_name"]))
    assert not names & {(c["first_name"], c["last_name"]) for c in base["customer"]}  # never an existing pair
    assert len({c["email"] for c in custs}) == 12  # UNIQUE
    ids = {c["user_id"] for c in custs}
    pms = state["payment_method"]
    assert pms and all(p["user_id"] in ids for p in pms)
    assert not {p["payment_id"] for p in pms} & {p["payment_id"] for p in base["payment_method"]}
    for p in pms:  # the label's digits follow the id's
        if p["kind"] == "credit_card":
            assert p["label"].endswith(p["payment_id"].rsplit("_", 1)[1])
    res = state["reservation"]
    assert res and all(r["user_id"] in ids for r in res)
    assert min(r["reservation_id"] for r in res) > max(r["reservation_id"] for r in base["reservation"])
    pm_owner = {p["payment_id"]: p["user_id"] for p in pms}
    res_owner = {r["reservation_id"]: r["user_id"] for r in res}
    assert state["payment"] and all(pm_owner[p["payment_id"]] == res_owner[p["reservation_id"]] for p in state["payment"])
    assert state["flight"] == base["flight"]  # the catalogue is shared
    again, _ = add_principals({"backend": "sqlite", "id": "airline"}, 12, seed=3)
    assert again == state  # seeded


def test_principals_on_another_domain_recombine_one_column_names():
    """clinic: patients (one full_name column) get names recombined word by word, new P-#### ids,
    and their referrals / appointments / prescriptions with remapped references."""
    from toolkit.envs.sqlite import SqliteEnvironment
    from toolkit.train.principals import add_principals

    env = SqliteEnvironment.from_ref({"backend": "sqlite", "id": "clinic"})
    base = env.snapshot()
    env.close()
    state, info = add_principals({"backend": "sqlite", "id": "clinic"}, 10, seed=1)
    assert info["principal_table"] == "patient" and len(state["patient"]) == 10
    firsts = {p["full_name"].split()[0] for p in base["patient"]}
    lasts = {p["full_name"].split()[-1] for p in base["patient"]}
    names = [p["full_name"] for p in state["patient"]]
    assert len(set(names)) == 10 and not set(names) & {p["full_name"] for p in base["patient"]}
    assert all(n.split()[0] in firsts and n.split()[-1] in lasts for n in names)
    ids = {p["patient_id"] for p in state["patient"]}
    assert not ids & {p["patient_id"] for p in base["patient"]} and all(i.startswith("P-") for i in ids)
    refs = {r["referral_id"] for r in state["referral"]}
    assert state["appointment"] and all(a["patient_id"] in ids for a in state["appointment"])
    assert all(a["referral_id"] is None or a["referral_id"] in refs for a in state["appointment"])
    assert state["doctor"] == base["doctor"]


def _learn(*args, env=None, cwd=None):
    e = dict(os.environ, PATH=f"{BIN}:{os.path.dirname(sys.executable)}:{os.environ['PATH']}",
             TOOLKIT_PYTHON=sys.executable, **(env or {}))
    return subprocess.run(["bash", str(ROOT / "recipes" / "learn.sh"), *args], capture_output=True, text=True,
                          env=e, timeout=300, cwd=cwd)


def _learn_config(tmp_path, *args, env=None):
    import yaml

    out = tmp_path / "out"
    p = _learn(*args, "--config-only", env={"OUT": str(out), **(env or {})}, cwd=tmp_path)
    assert p.returncode == 0, p.stderr[-3000:]
    assert not (out / "tasks.jsonl").exists()  # nothing ran
    return {c: yaml.safe_load((out / "config" / f"{c}.yaml").read_text())
            for c in ("gen-task", "validate-task", "rollout", "verify", "sft", "grpo")}


@pytest.mark.parametrize("scale", ["cpu", "gpu"])
def test_learn_recipe_scales_give_the_documented_effective_configuration(tmp_path, scale):
    """`learn.sh --config-only`: every stage accepts the recipe the scale writes, and the effective
    values (variant preset applied) are the ones docs/learn.md's scale table and issue 31 name: on
    policy, TA-GRPO's turn ratio and violation-only penalty, the scale's sizes and generation."""
    c = _learn_config(tmp_path, "--scale", scale, env={"LEARN_BF16": "false"})
    g = c["grpo"]
    assert g["variant"] == "ta-grpo" and g["max_staleness"] == 0 and g["turn_ratio"] == "turn"
    assert g["penalize_invalid_calls"] is False and g["empty_steps"] == "skip" and g["temperature"] == 1.0
    if scale == "gpu":
        assert g["generation"] == "vllm" and g["vllm_mode"] == "colocate"
        assert (g["max_steps"], g["tasks_per_step"], g["num_generations"], g["learning_rate"]) == (200, 16, 8, 2e-6)
        assert c["sft"]["max_steps"] == 300 and c["sft"]["system_prompt"] == "keep"
    else:  # one backward per episode on the CPU
        assert g["generation"] == "llamacpp" and g["gradient_accumulation_steps"] == 2 * 4
        assert (g["max_steps"], g["tasks_per_step"], g["num_generations"], g["learning_rate"]) == (12, 2, 4, 1e-4)
        assert c["sft"]["max_steps"] == 36 and c["sft"]["system_prompt"] == "drop"
        assert (c["sft"]["per_device_train_batch_size"], c["sft"]["gradient_accumulation_steps"]) == (4, 1)
    assert c["rollout"]["agent_system_prompt"] == c["sft"]["system_prompt"] == g["system_prompt"]
    assert c["gen-task"]["strategy"] == "logigen" and c["gen-task"]["max_writes"] == 1


def test_learn_recipe_deep_tasks_and_overrides(tmp_path):
    c = _learn_config(tmp_path, "--scale", "cpu", "--tasks", "deep",
                      env={"LEARN_BF16": "false", "LEARN_GRPO_LR": "3e-5", "LEARN_GRPO_G": "8", "LEARN_GRPO_TASKS": "1"})
    assert c["gen-task"]["violation_share"] == 0.5 and c["gen-task"]["boundary_share"] == 0.5
    assert c["rollout"]["agent_system_prompt"] == "keep" == c["grpo"]["system_prompt"]  # the policy is in the prompt
    # deep rows (~4.6k tokens) one per backward on the CPU, 4 per optimizer step as plain rows
    assert (c["sft"]["per_device_train_batch_size"], c["sft"]["gradient_accumulation_steps"]) == (1, 4)
    g = c["grpo"]
    assert g["learning_rate"] == 3e-5 and g["num_generations"] == 8 and g["gradient_accumulation_steps"] == 8
    assert g["max_fill_rounds"] == 16  # the preset's unless set
    (tmp_path / "astra").mkdir()
    astra = _learn_config(tmp_path / "astra", "--scale", "cpu",
                          env={"LEARN_BF16": "false", "LEARN_GRPO_VARIANT": "astra", "LEARN_GRPO_FILL_ROUNDS": "3"})
    assert astra["grpo"]["variant"] == "astra" and astra["grpo"]["filter"] == "adaptive"
    assert astra["grpo"]["max_fill_rounds"] == 3 and astra["grpo"]["max_staleness"] == 0
    bad = _learn("--scale", "tpu", "--config-only", cwd=tmp_path)
    assert bad.returncode == 2 and "--scale smoke|cpu|gpu" in bad.stderr
