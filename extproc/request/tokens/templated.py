"""A chat as the engine tokenizes it: rendered with the engine's chat template, then turned
into token ids with the engine's tokenizer — the ids whose blocks its prefix cache hashes
(engines.cached_blocks keys them for the exact prefix score).

What lives here: `render` (a plain chat's roles and texts -> the templated prompt string)
and `TemplatedIds` (per pool's `kv_events`: the string's ids, its tokenizer loaded once).

Why the whole string, tokenized at once: vLLM renders the template into one string and
tokenizes that (special markers such as <|im_start|> become their added tokens), so this
is what gives the engine's ids, message boundaries included. Its cost is a count of the
whole prompt on every request (the counter's per-message cache does not apply):
bench/results/kv-events-cost.md measures it. Only plain chats (InferenceRequest.chat_roles)
are rendered: tools, tool calls and content parts render by rules of each model's own.

The templates (the model's `chat_template`, the generation prompt added):
- chatml: `<|im_start|>{role}\\n{content}<|im_end|>\\n` per message, then
  `<|im_start|>assistant\\n` (Qwen; the tiny test model, tooling/stack/tiny_model.py);
- deepseek: the begin-of-sentence marker, the system messages' texts, then the User marker
  and the content per user message, the Assistant marker, content and end-of-sentence
  marker per assistant one, then the Assistant marker (DeepSeek V3's template, without its
  tools branch; not checked here on a real DeepSeek engine).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from extproc.request.tokens.native import FastokensBpe
from extproc.request.tokens.prompt import IdCounter, PromptCounter
from policy.domain import ChatTemplate, KvEvents

_BOS = "<\uff5cbegin\u2581of\u2581sentence\uff5c>"
_EOS = "<\uff5cend\u2581of\u2581sentence\uff5c>"
_USER = "<\uff5cUser\uff5c>"
_ASSISTANT = "<\uff5cAssistant\uff5c>"


def render(template: ChatTemplate, roles: Sequence[str], texts: Sequence[str]) -> str:
    if template is ChatTemplate.CHATML:
        turns = [
            f"<|im_start|>{role}\n{text}<|im_end|>\n"
            for role, text in zip(roles, texts, strict=True)
        ]
        return "".join(turns) + "<|im_start|>assistant\n"
    system = "\n\n".join(text for role, text in zip(roles, texts, strict=True) if role == "system")
    parts = [_BOS, system]
    for role, text in zip(roles, texts, strict=True):
        if role == "user":
            parts += (_USER, text)
        elif role == "assistant":
            parts += (_ASSISTANT, text, _EOS)
    parts.append(_ASSISTANT)
    return "".join(parts)


class TemplatedIds:
    """The engine's ids of plain chats, per pool's tokenizer (the counter's own where the
    pool names none)."""

    def __init__(self, counter: PromptCounter) -> None:
        self._counter = counter
        self._tokenizers: dict[str, IdCounter] = {}
        self._lock = asyncio.Lock()

    async def _tokenizer(self, path: str | None) -> IdCounter | None:
        if path is None:
            return self._counter.id_counter
        loaded = self._tokenizers.get(path)
        if loaded is None:
            async with self._lock:  # loaded once, off the loop (DeepSeek's: ~1.3 s)
                loaded = self._tokenizers.get(path)
                if loaded is None:
                    loaded = await asyncio.to_thread(FastokensBpe, Path(path))
                    self._tokenizers[path] = loaded
        return loaded

    async def ids(
        self, roles: Sequence[str], texts: Sequence[str], config: KvEvents
    ) -> np.ndarray | None:
        """None: not a plain chat, or no tokenizer that gives ids."""
        if not roles or len(roles) != len(texts):
            return None
        tokenizer = await self._tokenizer(config.tokenizer)
        if tokenizer is None:
            return None
        return tokenizer.token_ids(render(config.chat_template, roles, texts))
