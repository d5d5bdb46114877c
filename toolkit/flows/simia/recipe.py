"""`just simia SEEDS N`: the Simia-SFT flow end to end, then its yield table.

    python -m toolkit.flows.simia.recipe --seeds seeds.jsonl -n 4 [--out-dir out/simia]
        [--recipe recipes/simia.yaml] [--model M --base-url URL] [--limit K]

Steps (each a toolkit command run as a subprocess, files in --out-dir):
1. validate-task --strategy simia            seeds.validated.jsonl   (all seeds, with verdicts)
   → seeds.kept.jsonl                        (seed_prefilter passed)
2. simulate-env --mode trajectory -n N       simulated.jsonl         (+ simulate.rejects.jsonl)
3. repair --strategy rules                   clean.jsonl             (+ rules.rejects.jsonl)
4. verify --strategy grounding               grounded.jsonl          (+ grounding.rejects.jsonl:
                                                                      records with no real env)
then prints the yield table (toolkit.yieldtable over the stage log stages.jsonl, one row per step,
with Simia's own counts in its notes column: seeds kept / failed per check, trajectories simulated,
dropped and fixed per rule, grounding share) and writes yield.json.

Without --seeds, seeds are made offline from the bundled airline domain: its task records replayed
with `rollout --agent replay` (reference actions, real SQLite observations), so the grounding step
has a real environment to compare against. A step whose command exits 1 (some lines rejected) goes
on; exit 2 (usage) or a crash stops the recipe.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import click
from toolkit import yieldtable
from toolkit.flows.simia.prefilter import CHECKS
from toolkit.io import parse_jsonl

ROOT = Path(__file__).resolve().parents[3]


def _cmd(name: str) -> list[str]:
    shim = ROOT / "bin" / name
    if shim.exists():
        return [sys.executable, str(shim)]
    return [sys.executable, "-c", "from toolkit.cli import main; main()", name]


def _run(name: str, args: list[str], log: Path, label: str | None = None) -> int:
    """Run one step; its summary goes to the stage log `log` (the yield table's rows)."""
    click.echo(f"simia: {name} {' '.join(args)}", err=True)
    env = dict(os.environ, PYTHONPATH=str(ROOT), TOOLKIT_STAGE_LOG=str(log), TOOLKIT_STAGE_LABEL=label or name)
    with open(os.devnull, "rb") as fin:
        p = subprocess.run(_cmd(name) + args, stdin=fin, env=env)
    if p.returncode not in (0, 1):
        raise click.ClickException(f"{name} exited with {p.returncode}")
    return p.returncode


@click.command("simia", help=__doc__.split("\n\n")[0])
@click.option("--seeds", default="", help="Seed records (JSONL). Default: bundled airline tasks replayed.")
@click.option("-n", "n", type=int, default=2, show_default=True, help="Simulated trajectories per seed.")
@click.option("--out-dir", default="out/simia", show_default=True)
@click.option("--recipe", default=str(ROOT / "recipes" / "simia.yaml"), show_default=True)
@click.option("--limit", type=int, default=None, help="Use at most this many seeds.")
@click.option("--model", default=None)
@click.option("--base-url", default=None)
@click.option("--prefilter-llm/--no-prefilter-llm", default=None,
              help="Ask the LLM for the pre-filter grade (default: the recipe's prefilter_llm). A model too "
                   "small to write the JSON grade (the embedded SmolLM2-135M) fails every seed with it.")
def main(seeds: str, n: int, out_dir: str, recipe: str, limit: int | None, model: str | None,
         base_url: str | None, prefilter_llm: bool | None) -> None:
    if prefilter_llm is not None:  # a recipe key: reaches validate-task through its TOOLKIT_ variable
        os.environ["TOOLKIT_PREFILTER_LLM"] = "true" if prefilter_llm else "false"
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    f = {k: str(out / v) for k, v in {
        "seeds": "seeds.jsonl", "validated": "seeds.validated.jsonl", "kept": "seeds.kept.jsonl",
        "simulated": "simulated.jsonl", "sim_rej": "simulate.rejects.jsonl", "clean": "clean.jsonl",
        "rule_rej": "rules.rejects.jsonl", "val_rej": "validate.rejects.jsonl", "grounded": "grounded.jsonl", "ground_rej": "grounding.rejects.jsonl"}.items()}
    for k in ("val_rej", "sim_rej", "rule_rej", "ground_rej"):  # rejects files are appended to
        Path(f[k]).unlink(missing_ok=True)
    log = out / "stages.jsonl"
    log.write_text("")
    llm = (["--model", model] if model else []) + (["--base-url", base_url] if base_url else [])
    rec = ["--recipe", recipe] if recipe and Path(recipe).exists() else []
    lim = ["--limit", str(limit)] if limit else []
    if seeds:
        f["seeds"] = seeds
    else:
        tasks = str(out / "airline.tasks.jsonl")
        with open(tasks, "wb") as fo:
            subprocess.run(_cmd("toolkit") + ["tasks", "airline"], stdout=fo, check=True,
                           env=dict(os.environ, PYTHONPATH=str(ROOT)))
        _run("rollout", ["--agent", "replay", "-i", tasks, "-o", f["seeds"], "--no-progress"] + lim, log,
             label="seeds (replay)")
    _run("validate-task", ["--strategy", "simia", "-i", f["seeds"], "-o", f["validated"], "--rejects", f["val_rej"],
                           "--no-progress"]
         + rec + llm + lim, log)
    with open(f["validated"], encoding="utf-8") as fi, open(f["kept"], "w", encoding="utf-8") as fo:
        for line in fi:
            r = json.loads(line)
            if any(v["name"] == "seed_prefilter" and v["stage"] == "validate-task" and v["passed"]
                   for v in r.get("verdicts") or []):
                fo.write(line)
    _run("simulate-env", ["--mode", "trajectory", "-n", str(n), "-i", f["kept"], "-o", f["simulated"],
                          "--rejects", f["sim_rej"], "--no-progress"] + rec + llm, log)
    _run("repair", ["--strategy", "rules", "-i", f["simulated"], "-o", f["clean"], "--rejects", f["rule_rej"],
                    "--no-progress"] + rec, log)
    _run("verify", ["--strategy", "grounding", "-i", f["clean"], "-o", f["grounded"], "--rejects", f["ground_rej"],
                    "--no-progress"] + rec, log)
    table = yieldtable.add_notes(yieldtable.rows(yieldtable.load(log)),
                                 notes(f["validated"], f["simulated"], f["clean"], f["rule_rej"], f["grounded"]))
    (out / "yield.json").write_text(json.dumps(table, indent=1))
    click.echo(yieldtable.render(table))
    empty = yieldtable.check_nonempty(f["grounded"], yieldtable.load(log))
    if empty:  # an emptied run fails, naming the stage (the prefilter's keep step sits between
        click.echo(f"simia: {empty}", err=True)  # validate-task and simulate-env)
        sys.exit(1)


def _lines(path: str) -> list[dict]:
    return parse_jsonl(Path(path).read_text(encoding="utf-8"), path) if Path(path).exists() else []


def _rule(error: str) -> str:
    head = (error or "").split(":", 1)[0].strip()
    return head if head and " " not in head else "other"


def notes(validated: str, simulated: str, cleaned: str, rule_rejects: str, grounded: str) -> dict[str, dict]:
    """Simia's own counts per step (the notes column of the yield table), from the step outputs."""
    kept, failed = 0, Counter()
    for r in _lines(validated):
        vs = {v["name"]: v for v in r.get("verdicts") or [] if v.get("stage") == "validate-task"}
        s = vs.get("seed_prefilter")
        if s and s["passed"]:
            kept += 1
            continue
        bad = [c for c in CHECKS if c in vs and not vs[c]["passed"]]
        if bad:
            failed.update(bad)
        elif s and (s.get("scores") or {}).get("malformed"):
            failed["llm_grade_malformed"] += 1
        else:
            for k in ("completeness", "logic", "format"):
                if s and (s.get("scores") or {}).get(k) == 0.0:
                    failed[f"llm_{k}"] += 1
    seeds = {"kept (pre-filter passed)": kept, **{f"failed: {k}": n for k, n in sorted(failed.items())}}
    trajs = [t for r in _lines(simulated) for t in r.get("trajectories") or []]
    sim = {"trajectories": len(trajs), "strict parse ok": sum(1 for t in trajs if not t.get("error"))}
    lost = sum(1 for t in trajs if ((t.get("extra") or {}).get("simia") or {}).get("llm_error"))
    if lost:
        sim["passes lost (LLM error)"] = lost
    clean = _lines(cleaned)
    drops: Counter = Counter(_rule(x.get("error", "")) for x in _lines(rule_rejects))
    fixes: Counter = Counter()
    for r in clean:
        for v in r.get("verdicts") or []:
            if v.get("stage") == "repair" and v.get("name") == "simia_rules":
                if v["passed"]:
                    fixes.update((v.get("scores") or {}).get("fixes") or {})
                else:
                    drops[(v.get("scores") or {}).get("dropped") or "other"] += 1
    rules = {"trajectories kept": sum(len(r.get("trajectories") or []) for r in clean),
             **{f"dropped: {k}": n for k, n in sorted(drops.items())},
             **{f"fixed: {k}": n for k, n in sorted(fixes.items())}}
    shares = [(v.get("score") or 0.0, (v.get("scores") or {}).get("total") or 0)
              for r in _lines(grounded) for v in r.get("verdicts") or []
              if v.get("stage") == "verify" and v.get("name") == "grounding"]
    ground = {"trajectories grounded": len(shares)}
    if shares:
        ground.update({"mean share (per trajectory)": round(sum(s for s, _ in shares) / len(shares), 3),
                       "fully grounded (share 1.0)": sum(1 for s, _ in shares if s >= 1.0),
                       "calls replayed": sum(t for _, t in shares)})
    return {"validate-task": seeds, "simulate-env": sim, "repair": rules, "verify": ground}

if __name__ == "__main__":
    main()
