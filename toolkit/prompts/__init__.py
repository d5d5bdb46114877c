"""Versioned prompt templates, one file per role: `<name>.v<N>.txt`.

Flow prompts live in a subfolder per flow and are named with it: `load("logigen/architect")`
reads `toolkit/prompts/logigen/architect.v<N>.txt`.

Templates are jinja2 (StrictUndefined): placeholders are `{{name}}` (so JSON braces in prompts
need no escaping; a literal `{{`, `{%` or `{#` would need `{{ '{{' }}`), and a prompt that needs a loop
or a conditional writes it in the template, with the `tools_text` filter for tool lists. `load(name)` returns the
newest version; `load(name, 1)` a given one. `reflect` writes new versions next to user copies in
$TOOLKIT_PROMPTS (searched first), never over the shipped ones.
"""

from __future__ import annotations

import functools
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from toolkit.formats.tools import tools_text

_HERE = Path(__file__).parent
_PAT = re.compile(r"^(?P<name>[a-z0-9_]+)\.v(?P<ver>\d+)\.txt$")


@dataclass(frozen=True)
class Prompt:
    name: str
    version: int
    text: str

    @property
    def id(self) -> str:
        return f"{self.name}.v{self.version}"

    def render(self, **values: object) -> str:
        """The prompt with its `{{name}}` placeholders filled (jinja2, StrictUndefined: a missing
        value raises KeyError naming it). Loops, conditionals and the `tools_text` filter
        (toolkit.formats.tools.tools_text) are available to templates that need them."""
        tpl = _compiled(self.text)
        missing = [k for k in _variables(self.text) if k not in values]
        if missing:
            raise KeyError(f"prompt {self.id}: missing value for {{{{{missing[0]}}}}}")
        import jinja2  # (loaded by _env already)

        try:
            return tpl.render(**values)
        except jinja2.UndefinedError as e:
            raise KeyError(f"prompt {self.id}: {e.message}") from None


@functools.lru_cache(maxsize=1)
def _env() -> Any:
    """jinja2 with the settings that keep `{{var}}` files rendering exactly as the old regex did: no
    HTML escaping, the trailing newline kept, no whitespace trimming."""
    # jinja2 is imported by the first render, not at the top: every flow imports this module, and
    # every strategy command imports every flow (~50 ms of start-up, bench/startup_bench.py)
    import jinja2

    env = jinja2.Environment(undefined=jinja2.StrictUndefined, keep_trailing_newline=True, autoescape=False)
    env.filters["tools_text"] = tools_text
    return env


@functools.lru_cache(maxsize=256)
def _compiled(text: str) -> Any:
    return _env().from_string(text)


@functools.lru_cache(maxsize=256)
def _variables(text: str) -> tuple[str, ...]:
    """Top-level names the template reads, in order of first appearance."""
    import jinja2.meta  # (as _env)

    names = jinja2.meta.find_undeclared_variables(_env().parse(text))
    first = {n: text.find(n) for n in names}
    return tuple(sorted(names, key=lambda n: first[n]))


SHIPPED = _HERE


def _dirs(extra_dirs: list | None = None) -> list[Path]:
    extra = os.environ.get("TOOLKIT_PROMPTS")
    return [Path(d) for d in (extra_dirs or []) if d] + ([Path(extra)] if extra else []) + [_HERE]


def versions(name: str, dirs: list | None = None) -> dict[int, Path]:
    """Versions of a prompt: `dirs` (searched first), then $TOOLKIT_PROMPTS, then the shipped ones."""
    out: dict[int, Path] = {}
    sub, _, base = name.rpartition("/")
    for d in reversed(_dirs(dirs)):  # user dir wins on equal versions
        d = d / sub if sub else d
        if d.is_dir():
            for p in d.iterdir():
                m = _PAT.match(p.name)
                if m and m.group("name") == base:
                    out[int(m.group("ver"))] = p
    return out


def load(name: str, version: int | None = None, dirs: list | None = None) -> Prompt:
    vs = versions(name, dirs)
    if not vs:
        raise KeyError(f"no prompt named {name!r}")
    v = max(vs) if version is None else version
    if v not in vs:
        raise KeyError(f"prompt {name!r} has no version {v} (have {sorted(vs)})")
    return Prompt(name, v, vs[v].read_text(encoding="utf-8"))


OWNER_SUFFIX = ".owner.json"


def owner_path(path: Path) -> Path:
    """The sidecar that marks a prompt file as one prompt set's evolved version
    (`<role>.v<N>.txt` → `<role>.v<N>.owner.json`, written by `reflect`)."""
    return path.with_name(path.name[: -len(".txt")] + OWNER_SUFFIX)


def owner(path: Path) -> dict | None:
    """{prompt_set, ...} of an evolved prompt file, None for a shipped or user-written one."""
    import json

    try:
        return json.loads(owner_path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def load_for_set(name: str, version: int | None = None, dirs: list | None = None) -> Prompt:
    """A prompt as one prompt set sees it: the `version` it pinned, or else the newest version
    that is NOT another set's evolved copy (files with an owner sidecar). EigenData evolves each
    prompt set separately and AReaL-SEA's streams reflect "without cross-contamination": a set
    that never evolved a role keeps the shipped / user-written prompt."""
    if version is not None:
        return load(name, version, dirs)
    vs = {v: p for v, p in versions(name, dirs).items() if not owner_path(p).exists()}
    if not vs:
        raise KeyError(f"no prompt named {name!r} (outside evolved copies)")
    v = max(vs)
    return Prompt(name, v, vs[v].read_text(encoding="utf-8"))


# Prompt templates, loaded once per (name, prompt directories' mtimes) instead of a directory
# listing and a file read per episode and per user turn. A new version written by `reflect`
# changes its directory's mtime and is picked up.
_PROMPTS: dict[tuple, Prompt] = {}


def cached(name: str) -> Prompt:
    """`load(name)` (newest version), cached until a prompt directory changes."""
    dirs = _dirs()
    stamp = []
    for d in dirs:
        try:
            stamp.append(os.stat(d).st_mtime_ns)
        except OSError:
            stamp.append(None)
    key = (name, tuple(str(d) for d in dirs), tuple(stamp))
    p = _PROMPTS.get(key)
    if p is None:
        if len(_PROMPTS) > 64:
            _PROMPTS.clear()
        p = _PROMPTS[key] = load(name)
    return p
