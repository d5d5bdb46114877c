"""Layered configuration: built-in defaults < a registered preset the options name (grpo's variant) <
recipe YAML < environment variables < CLI flags.

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

Every key (a field of the command's options model, `toolkit.options`) can come from the
environment as `TOOLKIT_<KEY>` (upper case), e.g. TOOLKIT_BASE_URL, TOOLKIT_AGENT_MODEL,
TOOLKIT_VERIFIER_SOURCE; the field's type parses it ("8" -> int, "true" -> bool, lists and dicts as
JSON). Unknown keys are usage errors (`resolve`). Secrets (API keys) are never read from recipes or flags: only from the env var
named by `api_key_env` (default OPENAI_API_KEY).
"""

from __future__ import annotations

import hashlib
import json
import os
from typing import Any, Mapping
from toolkit.options import nearest
from toolkit.options import NON_OPTION_ENV, NON_OPTION_ENV_PREFIXES, env_field_value, with_preset

ENV_PREFIX = "TOOLKIT_"
SECRET_KEYS = ("api_key", "openai_api_key", "agent_api_key", "user_api_key", "judge_api_key")


class ConfigError(Exception):
    pass


def load_recipe(path: str | None) -> dict:
    if not path:
        return {}
    if not os.path.exists(path):
        raise ConfigError(f"recipe not found: {path}")
    import yaml  # here, not at the top: a command run without --recipe never parses YAML (~30 ms)

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


def _unknown(what: str, key: str, valid: set[str]) -> ConfigError:
    near = nearest(key, valid)
    return ConfigError(f"{what}: unknown key {key!r}" + (f" (did you mean {near!r}?)" if near else ""))


def resolve(command: str, model: type, recipe: dict, flags: dict, *, known_anywhere: Any = None,
            environ: Mapping[str, str] | None = None, recipe_path: str | None = None,
            warn: Any = None):
    """The typed options of `command`: model defaults < the preset the options name (grpo's
    `variant`: `options.with_preset`) < recipe `defaults:` < recipe `<command>:` < `TOOLKIT_<KEY>`
    env < flags, validated by `model` (a toolkit.options model).

    `defaults:` keys are checked against `known_anywhere` (every command's keys, or a callable
    returning them: one recipe serves all commands) and the ones this command lacks are skipped;
    `<command>:` keys must be this command's (a model with extra="allow", sft/grpo, takes any). Env vars: every key of the model; other `TOOLKIT_*` names that no command knows
    (and that are not in options.NON_OPTION_ENV) are reported through `warn`, not rejected.
    Raises ConfigError (a usage error) naming the key, the nearest valid one and the layer."""
    from pydantic import ValidationError

    environ = os.environ if environ is None else environ
    valid = set(model.model_fields)
    open_model = model.model_config.get("extra") == "allow"
    _anywhere: list[set[str]] = []

    def anywhere() -> set[str]:  # computed once, when needed (loads every command's model)
        if not _anywhere:
            k = known_anywhere() if callable(known_anywhere) else known_anywhere
            _anywhere.append(set(k or ()) | valid)
        return _anywhere[0]

    where = f"recipe {recipe_path}" if recipe_path else "recipe"
    vals: dict[str, Any] = {}
    source: dict[str, str] = {}
    for section in ("defaults", command):
        sect = recipe.get(section) or {}
        if not isinstance(sect, Mapping):
            raise ConfigError(f"{where}: section {section!r} must be a mapping")
        for k, v in sect.items():
            key = _norm_key(k)
            if key not in valid and not open_model:
                if section == "defaults" and key in anywhere():
                    continue  # another command's key
                raise _unknown(f"{where}: section {section!r}", key,
                               anywhere() if section == "defaults" else valid)
            vals[key] = v
            source[key] = f"{where} section {section!r}"
    for name, raw in environ.items():
        if not name.startswith(ENV_PREFIX):
            continue
        rest = name[len(ENV_PREFIX):]
        key = rest.lower()
        if key in valid:
            vals[key] = env_field_value(model.model_fields[key].annotation, raw)
            source[key] = f"environment variable {name}"
        elif (warn is not None and rest not in NON_OPTION_ENV and not rest.startswith(NON_OPTION_ENV_PREFIXES)
              and key not in anywhere()):
            near = nearest(key, anywhere())
            warn(f"{command}: ignoring environment variable {name}: not an option key"
                 + (f" (did you mean TOOLKIT_{near.upper()}?)" if near else ""))
    for k, v in flags.items():
        vals[k] = v
        source[k] = "command line"
    try:
        opts = model.model_validate(vals)
    except ValidationError as e:
        errs = []
        for err in e.errors()[:3]:
            key = str(err["loc"][0]) if err.get("loc") else "?"
            if err.get("type") == "extra_forbidden":
                raise _unknown(source.get(key, command), key, valid) from None
            got = vals.get(key, err.get("input"))
            errs.append(f"{key}: {err['msg']} (got {got!r} from {source.get(key, 'defaults')})")
        raise ConfigError(f"{command}: invalid option " + "; ".join(errs)) from None
    try:  # a registered preset the options name (grpo's variant) fills the keys no layer set
        return with_preset(opts)
    except ValueError as e:
        raise ConfigError(f"{command}: {e} (from {source.get(model.preset[0], 'defaults')})") from None


def dump(values: dict) -> str:
    """--print-config's YAML of the effective values (`cli.run.printable(opts)`)."""
    import yaml  # (as load_recipe: only --print-config writes YAML)

    printable = {k: v for k, v in sorted(values.items()) if k not in ("print_config",)}
    return yaml.safe_dump(json.loads(json.dumps(printable, default=str)), sort_keys=True)
