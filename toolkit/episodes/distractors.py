"""Distractor tools (irrelevant-tool mixing, `rollout --distractor-mode`; registry kind "distractors")."""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass

from toolkit import domains, registry
from toolkit.envs import load_env
from toolkit.io import UsageError
from toolkit.schema import Record


@dataclass(frozen=True)
class DistractorSettings:
    """What a distractor source may read besides the record: rollout's `distractor_pool` (extra
    tool specs), `embed_base_url` / `embed_model` (the embedder of similarity bands)."""

    pool: tuple = ()
    embed_base_url: str | None = None
    embed_model: str | None = None


def distractor_source(name: str, help: str = "", flow: str | None = None):
    """Register `fn(record, own_tools, n, seed, settings) -> [tool schemas]` as `--distractor-mode
    name`: the tools appended to the agent's tool list (own_tools: the env's agent tools; n:
    --distractor-tools; seed: the trajectory index; settings: a DistractorSettings)."""
    return registry.register("distractors", name, help=help, flow=flow)


def distractor_tools(record: Record, own: list[dict], n: int, seed: int, mode: str = "auto",
                     settings: DistractorSettings | None = None) -> list[dict]:
    """The tools `--distractor-mode mode` adds (random: n tools from other bundled domains;
    astra-random / bands: ASTRA's, registered by toolkit.flows.astra.mixing; auto, the default:
    the record's flow picks, see `auto_distractor_mode`)."""
    if mode == "auto":
        if n <= 0:
            return []
        mode = auto_distractor_mode(record)
    e = registry.lookup("distractors", mode)
    if e is None:
        raise UsageError(f"unknown --distractor-mode {mode!r}; choose from {', '.join(registry.names('distractors'))}")
    return e.obj(record, own, n, seed, settings or DistractorSettings())


# the distractor source a flow's records get by default (`--distractor-mode auto`): ASTRA mixes
# irrelevant tools by similarity band (§3.2.2); every other flow draws random tools
FLOW_DISTRACTORS = {"astra": "bands"}


def auto_distractor_mode(record: Record) -> str:
    flow = record.flow or ("astra" if isinstance((record.extra or {}).get("astra"), dict) else None)
    return FLOW_DISTRACTORS.get(flow or "", "random")


@distractor_source("auto", help="the record's flow picks: ASTRA records → bands, others → random")
def auto_distractors(record: Record, own: list[dict], n: int, seed: int,
                     settings: DistractorSettings) -> list[dict]:
    return distractor_tools(record, own, n, seed, mode="auto", settings=settings)


@distractor_source("random", help="N tools drawn from the other registered sqlite domains")
def random_distractors(record: Record, own: list[dict], n: int, seed: int,
                       settings: DistractorSettings) -> list[dict]:
    if n <= 0:
        return []
    pool: list[dict] = []
    own_names = {t["function"]["name"] for t in own}
    env_id = record.env.id if record.env else None
    for d in domains.list_domains():
        if d == env_id:
            continue
        with load_env({"backend": "sqlite", "id": d}) as e:
            pool += [t for t in e.tools("agent") if t["function"]["name"] not in own_names]
    rng = random.Random(int.from_bytes(hashlib.blake2b(f"{record.id}:{seed}".encode(), digest_size=8).digest(), "big"))
    rng.shuffle(pool)
    return pool[:n]
