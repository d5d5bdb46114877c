"""The per-stage yield/cost table: stage summaries written through $TOOLKIT_STAGE_LOG by real
commands (rejects and filter reasons included), and the table maker on hand-written summaries."""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path

from tests.conftest import jsonl, run_cmd

from toolkit import yieldtable

LIBRARY = str(Path(__file__).parent / "data" / "library")


def test_rows_and_render_from_summaries():
    s = [{"command": "gen-task", "read": 2, "written": 10, "rejected": 1, "dropped": 0, "seconds": 1.5,
          "reject_reasons": {"field env.backend": 1}, "llm": {"requests": 4, "prompt_tokens": 100,
                                                              "completion_tokens": 20, "cost": 0.01}},
         {"command": "validate-task", "read": 10, "written": 8, "rejected": 0, "dropped": 2, "seconds": 0.5,
          "drop_reasons": {"validate-task projection: failed": 2}}]
    rows = yieldtable.rows(s)
    assert [r["stage"] for r in rows] == ["gen-task", "validate-task", "total"]
    assert rows[0]["tokens"] == 120 and rows[0]["llm_requests"] == 4 and rows[0]["yield"] == 5.0
    assert rows[1]["yield"] == 0.8 and rows[1]["reasons"] == {"filter: validate-task projection: failed": 2}
    assert rows[2] == {"stage": "total", "in": 2, "out": 8, "yield": 4.0, "rejected": 1, "filtered": 2,
                       "fallbacks": 0, "pass": None, "llm_requests": 4, "tokens": 120, "cost": 0.01, "seconds": 2.0, "reasons": {}}
    text = yieldtable.render(rows)
    assert "reject: field env.backend x1" in text and text.splitlines()[0].startswith("stage")
    md = yieldtable.render(rows, markdown=True)
    assert md.count("\n") == 5 and md.startswith("| stage |")


def test_labels_groups_pass_rate_and_notes():
    s = [{"command": "verify", "label": "verify f1 (replay)", "group": "1", "read": 4, "written": 4,
          "verdicts": {"passed": 3, "total": 4}, "llm": {"requests": 2, "prompt_tokens": 5, "completion_tokens": 5}},
         {"command": "repair", "group": "1.r1", "read": 1, "written": 0, "rejected": 1,
          "reject_reasons": {"field trajectories.0": 1}}]
    rows = yieldtable.rows(s)
    assert [(r["group"], r["stage"], r["pass"]) for r in rows] == [("1", "verify f1 (replay)", 0.75),
                                                                  ("1.r1", "repair", None), ("", "total", None)]
    # a grouped run loops over its stages: the total has no in / out / yield, only sums
    assert (rows[2]["in"], rows[2]["out"], rows[2]["yield"], rows[2]["rejected"], rows[2]["tokens"]) == (
        None, None, None, 1, 10)
    yieldtable.add_notes(rows, {"repair": {"dropped: unknown_tool": 1}, "never ran": {"x": 1}})
    assert rows[1]["notes"] == {"dropped: unknown_tool": 1} and "notes" not in rows[0]
    md = yieldtable.render(rows, markdown=True).splitlines()
    assert md[0] == ("| group | stage | in | out | yield | rejected | filtered | fallbacks | pass | llm_requests | tokens"
                     " | cost | seconds | reasons | notes |")
    assert md[2] == "| 1 | verify f1 (replay) | 4 | 4 | 1.0 | 0 | 0 | 0 | 0.75 | 2 | 10 | 0.0000 | 0.0 | - | - |"
    assert md[3].endswith("| reject: field trajectories.0 x1 | dropped: unknown_tool: 1 |")


def test_fallbacks_and_warnings_are_a_column_and_reasons():
    s = [{"command": "verify", "read": 3, "written": 3,
          "fallback_reasons": {"context: tools compacted": 2, "judge (sea): prompt shortened to fit the context": 1},
          "warning_reasons": {"cut at max_tokens": 1}},
         {"command": "sft", "read": 3, "written": 3}]
    rows = yieldtable.rows(s)
    assert rows[0]["fallbacks"] == 3 and rows[1]["fallbacks"] == 0 and rows[2]["fallbacks"] == 3
    assert rows[0]["reasons"] == {"fallback: context: tools compacted": 2,
                                  "fallback: judge (sea): prompt shortened to fit the context": 1,
                                  "warning: cut at max_tokens": 1}
    text = yieldtable.render(rows)
    assert "fallbacks" in text.splitlines()[0] and "fallback: context: tools compacted x2" in text


def test_stage_log_from_real_commands(tmp_path):
    log = tmp_path / "stages.jsonl"
    env = {"TOOLKIT_STAGE_LOG": str(log)}
    src = [{"id": "lib", "env": {"backend": "sqlite", "path": LIBRARY}},
           {"id": "bad", "env": {"backend": "python", "path": "x.py"}}]
    r = run_cmd(["gen-task", "--strategy", "logigen", "--explorer", "symbolic", "-n", "4", "--seed", "7"],
                jsonl(src), env=env)
    assert r.returncode == 1
    tasks = [json.loads(x) for x in r.stdout.splitlines()]
    leak = copy.deepcopy(tasks[0])
    leak["id"] = "leaky"
    leak["task"]["instruction"] = "please run insert_loan"
    r = run_cmd(["validate-task", "--strategy", "logigen", "--filter", "passed"], jsonl(tasks + [leak]), env=env)
    assert r.returncode == 0 and len(r.stdout.splitlines()) == 4
    # the same stage again without the filter, labelled and grouped: the leaky task's failing verdict counts
    r = run_cmd(["validate-task", "--strategy", "logigen"], jsonl(tasks + [leak]),
                env=dict(env, TOOLKIT_STAGE_LABEL="validate (all)", TOOLKIT_STAGE_GROUP="2"))
    out = [json.loads(x) for x in r.stdout.splitlines()]
    ver = [v for o in out for v in o["verdicts"] if v["stage"] == "validate-task"]
    assert len(out) == 5 and sum(not v["passed"] for v in ver) >= 1
    summaries = yieldtable.load(log)
    assert [s["command"] for s in summaries] == ["gen-task", "validate-task", "validate-task"]
    assert summaries[0]["reject_reasons"] == {"field env.backend": 1}
    assert summaries[1]["drop_reasons"] == {"validate-task projection: failed": 1}
    assert summaries[1]["verdicts"]["passed"] == summaries[1]["verdicts"]["total"]  # only passing records written
    assert summaries[2]["verdicts"] == {"passed": sum(v["passed"] for v in ver), "total": len(ver)}
    assert (summaries[2]["label"], summaries[2]["group"]) == ("validate (all)", "2") and "label" not in summaries[1]
    r = run_cmd(["python", "-m", "toolkit.yieldtable", str(log), "--json", str(tmp_path / "y.json")])
    assert r.returncode == 0 and "filter: validate-task projection: failed x1" in r.stdout
    table = json.loads((tmp_path / "y.json").read_text())
    assert [t["stage"] for t in table] == ["gen-task", "validate-task", "validate (all)", "total"]
    assert table[1]["pass"] == 1.0 and table[2]["pass"] == round(sum(v["passed"] for v in ver) / len(ver), 3) < 1
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    assert run_cmd(["python", "-m", "toolkit.yieldtable", str(empty)]).returncode == 1


def test_logigen_synth_recipe_on_an_existing_domain(tmp_path):
    import os
    import sys

    root = Path(__file__).resolve().parent.parent
    env = {"OUT": str(tmp_path / "run"), "ROLLOUT_ARGS": "--agent replay -n 1", "TOOLKIT_PYTHON": sys.executable,
           "PATH": f"{root / 'bin'}:{os.path.dirname(sys.executable)}:{os.environ.get('PATH', '')}"}
    r = run_cmd(["bash", str(root / "recipes" / "logigen_synth.sh"), LIBRARY, "4"], env=env, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    out = tmp_path / "run"
    sft = [json.loads(x) for x in (out / "sft.jsonl").read_text().splitlines()]
    assert len(sft) == 4 and all(row["messages"][0]["role"] == "system" and row["tools"] for row in sft)
    table = json.loads((out / "yield.json").read_text())
    assert [t["stage"] for t in table] == ["gen-task", "validate-task", "rollout", "verify", "total"]
    assert table[-1]["out"] == 4 and "verify" in r.stderr
    # a brief file needs the Architect; without it the recipe says so (exit 2), never an empty run
    brief = tmp_path / "brief.jsonl"
    brief.write_text('{"id": "b", "plan": {"synthesis_plan": "a bakery"}}\n')
    r = run_cmd(["bash", str(root / "recipes" / "logigen_synth.sh"), str(brief), "2"], env=env, timeout=300)
    assert r.returncode in (0, 1, 2) and (r.returncode != 2 or "Architect" in r.stderr)


def _log(tmp_path, summaries):
    p = tmp_path / "stages.jsonl"
    p.write_text("".join(json.dumps(s) + "\n" for s in summaries))
    return p


def test_require_nonempty_names_the_stage_that_emptied_the_run(tmp_path):
    log = _log(tmp_path, [
        {"command": "gen-task", "read": 2, "written": 6},
        {"command": "validate-task", "read": 6, "written": 0, "rejected": 2, "dropped": 4,
         "drop_reasons": {"validate-task judge: failed": 4}, "reject_reasons": {"LLMError: context": 2}},
        {"command": "rollout", "read": 0, "written": 0}])
    empty = tmp_path / "final.jsonl"
    empty.write_text("")
    r = run_cmd([sys.executable, "-m", "toolkit.yieldtable", str(log), "--require-nonempty", str(empty)])
    assert r.returncode == 1
    assert "stage 'validate-task' emptied the run (read 6, wrote 0, rejected 2, filtered 4" in r.stderr
    assert "filter: validate-task judge: failed x4" in r.stderr
    full = tmp_path / "full.jsonl"
    full.write_text('{"id": "a"}\n')
    assert run_cmd([sys.executable, "-m", "toolkit.yieldtable", str(log), "--require-nonempty", str(full)]).returncode == 0


def test_require_nonempty_names_a_step_outside_the_log(tmp_path):
    between = [{"command": "validate-task", "read": 3, "written": 3}, {"command": "simulate-env", "read": 0, "written": 0}]
    msg = yieldtable.check_nonempty(tmp_path / "missing.jsonl", between)
    assert "between stage 'validate-task' (wrote 3) and stage 'simulate-env' (read 0)" in msg
    after = [{"command": "verify", "read": 3, "written": 3}]
    assert "after the last logged stage 'verify' (wrote 3)" in yieldtable.check_nonempty(tmp_path / "m.jsonl", after)
    nothing = [{"command": "gen-task", "read": 0, "written": 0}]
    assert "the first stage 'gen-task' read no records" in yieldtable.check_nonempty(tmp_path / "m.jsonl", nothing)
