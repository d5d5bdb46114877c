"""`simulate-env --mode trajectory`: Simia's one-call trajectory simulation (§2.2.1 stages 2-3).

For each seed record, `-n` passes; pass k asks the LLM once — (tools, policy, format, exactly one
seed exemplar) in the prompt `simia/synth_<family>` (family `apigen` = Fig 9, APIGen-MT / τ style;
`officebench` = Fig 10; recipe key `prompt_family`) — for a whole new trajectory: user turns,
reasoning, tool calls and simulated observations.

Temperature spread (recipe keys): `temperatures: [..]` is cycled over the passes; else the passes
are spread evenly over [`temperature` − `temperature_spread`, `temperature`] (defaults 1.0 and 0.3;
one pass uses `temperature`). Pass k also sends `sample_index=k`, so the request cache never
answers two passes with the same text.

Output: one record per pass, id `<seed id>-sim<k>`, `parent_id` = seed id, `flow=simia`, the
seed's env and tools, one trajectory `<id>-t0` with `termination: simulated`. Its `messages` are
the seed's system prompt (Simia keeps it separately) followed by the strict parse of the reply
(`transcript.parse`, no repair); a reply that does not parse strictly gets `messages=[]` and
`error` naming the problem. A pass whose LLM call fails (endpoint error after retries) is written with `termination: error`,
no messages and `extra.simia.llm_error` (the rules drop it as `empty`); the seed is rejected only
when every pass fails. `extra.simia` keeps the raw text, the seed's system prompt, prompt id,
family, temperature, pass and parse problems: `repair --strategy rules` re-reads the raw text with repair on.
"""

from __future__ import annotations

import asyncio
from typing import Any

from toolkit.flows.simia import transcript as T
from toolkit.io import StageError, add_provenance, note_warning
from toolkit.schema import Message, Provenance, Record, Task, Trajectory, Usage
from toolkit.stages.registry import StageContext, strategy
from toolkit import prompts
from toolkit.flows.simia.prefilter import env_policy, prompt_tools, seed_of
from toolkit.llm import LLMError, get_client, llm_config
from toolkit.options import SimulateEnvOptions
from toolkit.roles.structured import add_usage, new_usage

FAMILIES = {"apigen": "ASSISTANT", "officebench": "GPT"}
TOP_TEMPERATURE = 1.0  # the top of the spread when the (LLM) key `temperature` is unset


def temperatures(opts: SimulateEnvOptions, n: int) -> list[float]:
    """The passes' temperatures: `temperatures` cycled, else n spread evenly over
    [temperature - temperature_spread, temperature] (temperature unset: TOP_TEMPERATURE)."""
    if opts.temperatures:
        return [opts.temperatures[k % len(opts.temperatures)] for k in range(n)]
    top = opts.temperature if opts.temperature is not None else TOP_TEMPERATURE
    spread = opts.temperature_spread
    if n == 1:
        return [top]
    lo = max(0.0, top - spread)
    return [round(lo + (top - lo) * k / (n - 1), 4) for k in range(n)]


@strategy("simulate-env:mode", "trajectory",
          help="Simia appendix C: -n whole new trajectories per seed record in one call each")
def build_mode(opts: SimulateEnvOptions, ctx: StageContext):
    return build(opts, ctx.meter)


def build(opts: SimulateEnvOptions, meter: Any):
    family, n, index = opts.prompt_family, opts.n, opts.seed_trajectory
    temps = temperatures(opts, n)
    lcfg = llm_config(opts, role="env")
    model = lcfg.model or "embedded"
    client = get_client(lcfg, meter)
    prompt = prompts.load(f"simia/synth_{family}")

    async def one(record: Record, k: int, text_prompt: str, system: str | None, tools: list[dict]) -> Record:
        # not ask_structured: one sample per pass and no retry; a reply that does not parse is data
        # (written with its error, fixed or dropped and counted by repair --strategy rules)
        res = await client.chat([{"role": "user", "content": text_prompt}], sample_index=k, temperature=temps[k])
        raw = res.message.get("content") or ""
        if res.finish_reason == "length":
            note_warning(f"simulated trajectories cut at max_tokens ({lcfg.max_tokens}; finish_reason=length): "
                         "repair drops them as `truncated`; raise max_tokens")
        rid = f"{record.id}-sim{k}"
        conv = T.parse(raw)
        problems = [str(p) for p in conv.problems]
        msgs: list[dict] = ([{"role": "system", "content": system}] if system else []) + conv.messages
        error = None
        try:
            messages = [Message.model_validate(m) for m in msgs] if not problems else []
        except ValueError as e:  # pragma: no cover - the parser only writes valid shapes
            messages, problems = [], problems + [f"invalid_messages: {e}"]
        if problems:
            error = "the simulated text does not parse strictly (" + "; ".join(problems)[:500] + \
                    "): run repair --strategy rules"
        usage = Usage(**add_usage(new_usage(), res))
        traj = Trajectory(id=f"{rid}-t0", messages=messages, tools=tools, termination="simulated", error=error,
                          agent_model=res.model or model, usage=usage,
                          extra={"simia": {"raw": raw, "prompt": prompt.id, "family": family,
                                           "temperature": temps[k], "pass": k, "seed_id": record.id, "system": system,
                                           "finish_reason": res.finish_reason, "parse_problems": problems}})
        first_user = next((m["content"] for m in conv.messages if m["role"] == "user"), None)
        out = Record(id=rid, parent_id=record.id, flow="simia",
                     tags=list(dict.fromkeys(list(record.tags) + ["simulated"])),
                     env=record.env.model_copy(deep=True) if record.env else None,
                     task=Task(instruction=first_user) if first_user else None,
                     trajectories=[traj],
                     provenance=[Provenance.model_validate(p.model_dump()) for p in record.provenance])
        add_provenance(out, "simulate-env", strategy="simia:trajectory", model=res.model or model,
                       recipe_hash=opts.recipe_hash, usage=usage.model_dump())
        return out

    async def fn(record: Record) -> list[Record]:
        turns, tools, msgs = seed_of(record, index)
        conv = T.to_messages(turns)
        if conv.problems:
            raise StageError("the seed does not parse (" + "; ".join(map(str, conv.problems))[:300] +
                             "): run validate-task --strategy simia --filter passed first", field="trajectories")
        if not tools:
            raise StageError("the seed lists no tools (trajectory.tools, extra.tools or the environment)",
                             field="trajectories.0.tools")
        system = next((t.text for t in turns if t.role == T.SYSTEM), None)
        policy = env_policy(record, msgs or ([{"role": "system", "content": system}] if system else []))
        text_prompt = prompt.render(
            sample_text=T.render(conv.messages, assistant_label=FAMILIES[family]),
            available_tools=prompt_tools(tools, opts.compact_tools),
            policy=policy or "(none)")
        results = await asyncio.gather(*(one(record, k, text_prompt, system, tools) for k in range(n)),
                                       return_exceptions=True)
        out: list[Record] = []
        errors: list[str] = []
        for k, r in enumerate(results):
            if isinstance(r, LLMError):  # one pass lost to the endpoint: keep the others, mark this one
                errors.append(f"pass {k}: {r}")
                out.append(failed_pass(record, k, str(r)))
            elif isinstance(r, BaseException):
                raise r
            else:
                out.append(r)
        if errors and len(errors) == n:
            raise StageError("every simulation pass failed: " + "; ".join(errors)[:500])
        return out

    def failed_pass(record: Record, k: int, err: str) -> Record:
        rid = f"{record.id}-sim{k}"
        traj = Trajectory(id=f"{rid}-t0", messages=[], termination="error", error=f"LLM error: {err}"[:1000],
                          extra={"simia": {"pass": k, "temperature": temps[k], "seed_id": record.id,
                                           "prompt": prompt.id, "family": family, "llm_error": True}})
        return Record(id=rid, parent_id=record.id, flow="simia", tags=list(dict.fromkeys(list(record.tags) + ["simulated"])),
                      env=record.env.model_copy(deep=True) if record.env else None, trajectories=[traj])

    return fn
