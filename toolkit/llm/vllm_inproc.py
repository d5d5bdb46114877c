"""In-process vLLM (`base_url="vllm-inprocess"`): vLLM's offline `LLM` engine in this process,
micro-batching concurrent requests (GPU batch jobs; a clear LLMError when vllm is missing)."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import threading
import weakref
from typing import Any


from .base import VLLM_INPROCESS, LLMConfig, LLMError


# ----------------------------------------------------------------------------------------------
# In-process vLLM (GPU batch jobs)


class _VLLMInProcess:
    """vLLM's offline engine with micro-batching: concurrent chat() calls arriving within a few
    milliseconds are sent to `LLM.chat` together."""

    _engines: dict[str, Any] = {}
    _engines_lock = threading.Lock()

    def __init__(self, config: LLMConfig):
        if importlib.util.find_spec("vllm") is None:
            raise LLMError(
                "base_url='vllm-inprocess' needs the vllm package, which is not installed "
                "(pip install vllm, on a machine with a CUDA GPU). Alternatively run "
                "`vllm serve MODEL` and pass --base-url http://HOST:8000/v1.",
                endpoint=VLLM_INPROCESS)
        if not config.model:
            raise LLMError("base_url='vllm-inprocess' needs --model (a HF model id or path)",
                           endpoint=VLLM_INPROCESS)
        self.model = config.model
        self.max_batch = max(1, config.concurrency)
        self._queues: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Queue]" = weakref.WeakKeyDictionary()
        self._workers: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Task]" = weakref.WeakKeyDictionary()

    def _engine(self):
        with self._engines_lock:
            eng = self._engines.get(self.model)
            if eng is None:
                from vllm import LLM  # type: ignore

                eng = self._engines[self.model] = LLM(model=self.model)
            return eng

    def _run_batch(self, items: list[tuple]) -> list[Any]:
        from vllm import SamplingParams  # type: ignore

        eng = self._engine()
        # LLM.chat takes one tools list per call: group by tools.
        groups: dict[str, list[int]] = {}
        for i, (msgs, tools, params) in enumerate(items):
            groups.setdefault(json.dumps(tools, sort_keys=True, default=str), []).append(i)
        results: list[Any] = [None] * len(items)
        for key, idx in groups.items():
            sps = []
            for i in idx:
                p = items[i][2]
                kw = {"temperature": p.get("temperature", 0.0), "max_tokens": p.get("max_tokens", 512)}
                for k in ("top_p", "seed", "stop", "top_k", "presence_penalty", "frequency_penalty",
                          "repetition_penalty"):
                    if p.get(k) is not None:
                        kw[k] = p[k]
                if p.get("structured_outputs"):  # constrain_tool_calls (toolkit.llm.constrain)
                    from vllm.sampling_params import StructuredOutputsParams  # type: ignore

                    kw["structured_outputs"] = StructuredOutputsParams(**p["structured_outputs"])
                sps.append(SamplingParams(**kw))
            tools = items[idx[0]][1]
            try:
                outs = eng.chat([items[i][0] for i in idx], sps, use_tqdm=False,
                                **({"tools": tools} if tools else {}))
                for i, o in zip(idx, outs):
                    results[i] = o
            except Exception as exc:  # pragma: no cover - surfaced per request
                for i in idx:
                    results[i] = exc
        return results

    async def _worker(self, q: asyncio.Queue) -> None:
        while True:
            first = await q.get()
            batch = [first]
            await asyncio.sleep(0.005)
            while not q.empty() and len(batch) < self.max_batch:
                batch.append(q.get_nowait())
            try:
                outs = await asyncio.to_thread(self._run_batch, [b[0] for b in batch])
            except Exception as exc:
                outs = [exc] * len(batch)
            for (_, fut), out in zip(batch, outs):
                if not fut.done():
                    if isinstance(out, Exception):
                        fut.set_exception(out)
                    else:
                        fut.set_result(out)

    async def generate(self, messages: list[dict], tools: list[dict] | None, params: dict):
        loop = asyncio.get_running_loop()
        q = self._queues.get(loop)
        if q is None:
            q = self._queues[loop] = asyncio.Queue()
            self._workers[loop] = loop.create_task(self._worker(q))
        fut = loop.create_future()
        await q.put(((messages, tools, params), fut))
        out = await fut
        comp = out.outputs[0]
        return (comp.text, len(out.prompt_token_ids or []), len(comp.token_ids or []),
                comp.finish_reason)
