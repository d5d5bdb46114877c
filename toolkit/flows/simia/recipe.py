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
then prints the yield table (toolkit.flows.simia.yieldtable) and writes yield.json.

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
from pathlib import Path

import click

ROOT = Path(__file__).resolve().parents[3]


def _cmd(name: str) -> list[str]:
    shim = ROOT / "bin" / name
    if shim.exists():
        return [sys.executable, str(shim)]
    return [sys.executable, "-c", "from toolkit.cli import main; main()", name]


def _run(name: str, args: list[str], stdin_path: str | None = None) -> int:
    click.echo(f"simia: {name} {' '.join(args)}", err=True)
    with open(stdin_path, "rb") if stdin_path else open(os.devnull, "rb") as fin:
        p = subprocess.run(_cmd(name) + args, stdin=fin, env=dict(os.environ, PYTHONPATH=str(ROOT)))
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
    from toolkit.flows.simia import yieldtable

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
        _run("rollout", ["--agent", "replay", "-i", tasks, "-o", f["seeds"], "--no-progress"] + lim)
    _run("validate-task", ["--strategy", "simia", "-i", f["seeds"], "-o", f["validated"], "--rejects", f["val_rej"],
                           "--no-progress"]
         + rec + llm + lim)
    with open(f["validated"], encoding="utf-8") as fi, open(f["kept"], "w", encoding="utf-8") as fo:
        for line in fi:
            r = json.loads(line)
            if any(v["name"] == "seed_prefilter" and v["stage"] == "validate-task" and v["passed"]
                   for v in r.get("verdicts") or []):
                fo.write(line)
    _run("simulate-env", ["--mode", "trajectory", "-n", str(n), "-i", f["kept"], "-o", f["simulated"],
                          "--rejects", f["sim_rej"], "--no-progress"] + rec + llm)
    _run("repair", ["--strategy", "rules", "-i", f["simulated"], "-o", f["clean"], "--rejects", f["rule_rej"],
                    "--no-progress"] + rec)
    _run("verify", ["--strategy", "grounding", "-i", f["clean"], "-o", f["grounded"], "--rejects", f["ground_rej"],
                    "--no-progress"] + rec)
    rows = yieldtable.collect(f["validated"], f["simulated"], f["sim_rej"], f["clean"], f["rule_rej"],
                              f["grounded"], f["ground_rej"], seeds_in=None if limit else f["seeds"],
                              validate_rejects=f["val_rej"])
    (out / "yield.json").write_text(json.dumps([{"step": a, "item": b, "count": c} for a, b, c in rows], indent=1))
    click.echo(yieldtable.render(rows))


if __name__ == "__main__":
    main()
