"""The policy as a rollout agent: one append-only token list per episode (no re-tokenization drift)."""

from __future__ import annotations

import json
from typing import Any

from toolkit.formats.tools import prepare_tools
from toolkit.train.export import prepare_system
from toolkit.train.grpo.generators import ScriptedGenerator
from toolkit.train.grpo.options import GRPOOptions
from toolkit.llm.toolcalls import parse_tool_calls

# ----------------------------------------------------------------------------------------------
# the policy as a rollout agent


class ContextFull(Exception):
    pass


def _render_copy(messages: list[dict]) -> list[dict]:
    """Messages for the chat template: tool-call arguments as dicts (never double-encoded)."""
    out = []
    for m in messages:
        if m.get("tool_calls"):
            m = dict(m)
            calls = []
            for tc in m["tool_calls"]:
                fn = dict(tc["function"])
                a = fn.get("arguments")
                if isinstance(a, str):
                    try:
                        a = json.loads(a) if a.strip() else {}
                    except json.JSONDecodeError:
                        pass
                fn["arguments"] = a
                calls.append({**tc, "function": fn})
            m["tool_calls"] = calls
        out.append(m)
    return out


_TOOL_BLOCK = None


def _strictly_valid(text: str) -> bool:
    """Every <tool_call> block is a JSON object {"name": str, "arguments": object} exactly as written."""
    import re

    global _TOOL_BLOCK
    if _TOOL_BLOCK is None:
        _TOOL_BLOCK = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
    blocks = _TOOL_BLOCK.findall(text)
    if not blocks:
        return False
    for b in blocks:
        try:
            obj = json.loads(b)
        except json.JSONDecodeError:
            return False
        if not (isinstance(obj, dict) and isinstance(obj.get("name"), str) and isinstance(obj.get("arguments", {}), dict)):
            return False
    return True


class PolicyAgent:
    """rollout's Agent protocol (`act(messages, tools, usage) -> assistant message`) backed by the
    policy being trained; records the token stream of its episode (see module doc)."""

    name = "policy"

    def __init__(self, tok, generator, opts: GRPOOptions, key: str = ""):
        self.tok, self.generator, self.opts, self.key = tok, generator, opts, key
        self.ids: list[int] = []
        self.mask: list[int] = []       # 1 = sampled by the policy
        self.turn_of: list[int] = []    # agent turn of each token (-1 = context)
        self.calls_per_turn: list[int] = []
        self.seen: list[dict] | None = None
        self.format_errors = 0
        self.eos_text = tok.eos_token
        self.prompt_len = 0
        self.truncated = False
        self.sampling_logps: list[float] | None = None  # the sampler's log-prob per id (NaN = context)

    def _render(self, msgs: list[dict], tools: list[dict], gen: bool) -> str:
        return self.tok.apply_chat_template(_render_copy(msgs), tools=tools or None, tokenize=False,
                                            add_generation_prompt=gen)

    def _append(self, ids: list[int], policy: bool, turn: int = -1, logps: list[float] | None = None) -> None:
        if logps is not None and self.sampling_logps is None:
            self.sampling_logps = [float("nan")] * len(self.ids)
        if self.sampling_logps is not None:
            self.sampling_logps.extend(logps if logps is not None else [float("nan")] * len(ids))
        self.ids.extend(ids)
        self.mask.extend([1 if policy else 0] * len(ids))
        self.turn_of.extend([turn if policy else -1] * len(ids))

    async def act(self, messages: list[dict], tools: list[dict], usage: Any) -> dict:
        msgs = prepare_system([dict(m) for m in messages], self.opts.system_prompt)
        rtools = prepare_tools(list(tools or []), self.opts.tool_schema)
        if self.seen is None:
            text = self._render(msgs, rtools, True)
            self._append(self.tok(text, add_special_tokens=False)["input_ids"], False)
            self.prompt_len = len(self.ids)
        else:
            k = len(self.seen)
            if msgs[:k] != self.seen:
                raise RuntimeError("the conversation history changed between agent turns; cannot extend the token stream")
            prev = self._render(self.seen, rtools, False)
            full = self._render(msgs, rtools, True)
            if not full.startswith(prev):
                raise RuntimeError("chat template is not prefix-stable (rendering of earlier turns changed); "
                                   "use --chat-template toolkit or a prefix-preserving template")
            glue = prev[prev.rindex(self.eos_text) + len(self.eos_text):] if self.eos_text in prev else ""
            closing = "" if (self.ids and self.ids[-1] == self.tok.eos_token_id) else self.eos_text
            self._append(self.tok(closing + glue + full[len(prev):], add_special_tokens=False)["input_ids"], False)
        room = self.opts.max_total_tokens - len(self.ids)
        if room <= 0:
            self.truncated = True
            raise ContextFull(f"context_length: episode reached max_total_tokens={self.opts.max_total_tokens}")
        before = len(self.ids)
        kw = {"key": self.key} if isinstance(self.generator, ScriptedGenerator) else {}
        comp = await self.generator.generate(list(self.ids), min(self.opts.max_new_tokens, room), **kw)
        turn = len(self.calls_per_turn)
        self._append(list(comp), True, turn, getattr(comp, "logps", None))
        usage.prompt_tokens += before
        usage.completion_tokens += len(comp)
        usage.requests += 1
        text = self.tok.decode(comp, skip_special_tokens=False)
        text = text.removesuffix(self.eos_text)
        for sp in (self.tok.pad_token,):
            if sp:
                text = text.replace(sp, "")
        content, calls, err = parse_tool_calls(text)
        if calls and self.opts.strict_tool_calls and not _strictly_valid(text):
            content, calls, err = text, [], "tool call is not valid JSON as generated"
        if err:
            self.format_errors += 1
        msg: dict = {"role": "assistant", "content": content if content is not None else ("" if not calls else None)}
        if calls:
            msg["tool_calls"] = calls
        self.calls_per_turn.append(len(calls))
        self.seen = msgs + [msg]
        return msg
