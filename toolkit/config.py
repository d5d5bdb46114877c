"""Layered configuration: built-in defaults < recipe YAML < environment variables < CLI flags.

The merged config of a command is a flat dict keyed by option name (the click parameter name,
e.g. `model`, `agent_base_url`, `concurrency`, `strategy`).

Recipe file (`--recipe recipes/logigen.yaml`):

    defaults:            # applies to every command
      model: Qwen/Qwen3-8B
      base_url: http://localhost:8000/v1
    rollout:             # one section per command (the command's name)
      n: 4
      max_turns: 30
    verify:
      strategy: [state_diff]

Environment variables: `TOOLKIT_<NAME>` (upper case), e.g. TOOLKIT_BASE_URL, TOOLKIT_MODEL,
TOOLKIT_AGENT_MODEL, TOOLKIT_CONCURRENCY. Values are parsed as YAML scalars (so "8" is an int,
"true" a bool). Secrets (API keys) are never read from recipes or flags: only from the env var
named by `api_key_env` (default OPENAI_API_KEY).
"""

from __future__ import annotations

import hashlib
import json
import os
from typing import Any, Mapping

import yaml

ENV_PREFIX = "TOOLKIT_"
SECRET_KEYS = ("api_key", "openai_api_key", "agent_api_key", "user_api_key", "judge_api_key")


class ConfigError(Exception):
    pass


def load_recipe(path: str | None) -> dict:
    if not path:
        return {}
    if not os.path.exists(path):
        raise ConfigError(f"recipe not found: {path}")
    with open(path, encoding="utf-8") as f:
        try:
            data = yaml.safe_load(f) or {}
        except yaml.YAMLError as e:
            raise ConfigError(f"recipe {path}: invalid YAML: {e}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"recipe {path}: top level must be a mapping of sections")
    for key in data:
        sect = data[key]
        if isinstance(sect, Mapping):
            for k in sect:
                if str(k).lower() in SECRET_KEYS:
                    raise ConfigError(f"recipe {path}: section {key!r} sets {k!r}; secrets come only "
                                      f"from environment variables (see api_key_env)")
    return data


def recipe_hash(path: str | None) -> str | None:
    if not path or not os.path.exists(path):
        return None
    with open(path, "rb") as f:
        return "sha256:" + hashlib.sha256(f.read()).hexdigest()[:16]


def _norm_key(k: str) -> str:
    return str(k).replace("-", "_").lower()


def env_overrides(keys: list[str], environ: Mapping[str, str] | None = None) -> dict:
    environ = os.environ if environ is None else environ
    out = {}
    for k in keys:
        name = ENV_PREFIX + k.upper()
        if name in environ:
            raw = environ[name]
            try:
                out[k] = yaml.safe_load(raw)
            except yaml.YAMLError:
                out[k] = raw
    return out


def merge(command: str, defaults: dict, recipe: dict, env: dict, flags: dict) -> dict:
    """defaults < recipe[defaults] < recipe[command] < env < flags."""
    cfg = dict(defaults)
    for section in ("defaults", command):
        sect = recipe.get(section) or {}
        if not isinstance(sect, Mapping):
            raise ConfigError(f"recipe section {section!r} must be a mapping")
        for k, v in sect.items():
            cfg[_norm_key(k)] = v
    cfg.update(env)
    cfg.update(flags)
    return cfg


def dump(cfg: dict) -> str:
    printable = {k: v for k, v in sorted(cfg.items()) if k not in ("print_config",)}
    return yaml.safe_dump(json.loads(json.dumps(printable, default=str)), sort_keys=True)


def llm_config(cfg: dict, role: str | None = None):
    """Build an LLMConfig for a role ("agent", "user", "judge", "env" ...) from a merged config.

    Role-prefixed keys (agent_model, agent_base_url, agent_temperature ...) override the plain
    ones (model, base_url, temperature ...).
    """
    from toolkit.llm import LLMConfig

    fields = LLMConfig.model_fields
    vals: dict[str, Any] = {}
    for name in fields:
        if cfg.get(name) is not None:
            vals[name] = cfg[name]
        if role and cfg.get(f"{role}_{name}") is not None:
            vals[name] = cfg[f"{role}_{name}"]
    return LLMConfig(**vals)
