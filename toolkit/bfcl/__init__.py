"""BFCL (Berkeley Function Calling Leaderboard, `bfcl-eval`) multi-turn bridge: its entries as task
records, its API classes as a python environment run in the sandbox, its checker as a scorer.

Needs the optional extra `bfcl` (`pip install --no-deps bfcl-eval`: its pins would downgrade
numpy; the multi-turn API classes and checker need nothing else).

- `task_records(category)`: one record per entry of `BFCL_v4_<category>.json` (multi_turn_base,
  multi_turn_miss_func, multi_turn_miss_param, multi_turn_long_context): scripted user turns
  (`task.user_turns`), the tools of the involved classes (BFCL's type names mapped as BFCL maps
  them; `missed_function`s held back until their turn: `task.held_out_tools`), the initial config
  as the env state, the ground truth per turn (`task.ground_truth.turns`, and flattened in
  `actions`), the raw entry in `extra.bfcl`.
- `ENV_SOURCE` (env.py): the python environment's tool source; each call rebuilds the classes from
  the initial config, replays the calls so far and runs the new one, inside the sandbox.
- `check(...)` (check.py): bfcl-eval's own `multi_turn_checker` (state after each turn + response
  checks), run inside the sandbox.
"""

from toolkit.bfcl.data import (
                               CATEGORIES,
                               BfclUnavailable,
                               available,
                               call_string,
                               load_entries,
                               openai_tools,
                               parse_call,
                               task_records,
)

__all__ = ["CATEGORIES", "BfclUnavailable", "available", "call_string", "load_entries", "openai_tools",
           "parse_call", "task_records"]
