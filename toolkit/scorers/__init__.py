"""The scoring engine, below the commands: what `verify` runs, and GRPO's reward, the SFT export,
the trainer integrations and the flows use alike.

    core     the scorer registry decorator (`scorer`), what a scorer gets (`Scoring`) and returns
             (`Outcome`), the run's `Plan` resolved from the typed VerifyOptions
    calls    a trajectory's tool calls in execution order (`trajectory_calls`)
    replay   the rebuilt environment per record (`EnvContext`), the target-state cache and the
             replay memo of a run (`TargetCache`)
    builtin  the built-in scorers: state_diff, actions, f1, code, judge, tau2
    bfcl     BFCL's multi-turn checker
    engine   `Verifier`: every scorer on every trajectory of a record, verdicts and reward written
             (`from toolkit.scorers.engine import Verifier`: the package exports the scorer API
             without the LLM client the engine needs)

Next to toolkit.scoring (the pure reward and state functions of the lowest layer, which the
environments themselves use): this package needs the environments, the sandbox and the LLM
roles, so it sits above them.
"""

from toolkit.scorers.calls import Call, final_answer, trajectory_calls
from toolkit.scorers.core import (POLICY_VIOLATION, VERDICT_KINDS, Outcome, Plan, Scoring, scorer, scorer_names,
                                  verify_options)
from toolkit.scorers.replay import EnvContext, TargetCache, TargetInfo

__all__ = ["Call", "final_answer", "trajectory_calls", "POLICY_VIOLATION", "VERDICT_KINDS", "Outcome", "Plan",
           "Scoring", "scorer", "scorer_names", "verify_options", "EnvContext", "TargetCache",
           "TargetInfo"]
