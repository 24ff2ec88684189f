"""A chat as the engine tokenizes it: rendered with the engine's chat template, then turned
into token ids with the engine's tokenizer — the ids whose blocks its prefix cache hashes
(engines.cached_blocks keys them for the exact prefix score).

What lives here: `render` (a plain chat's roles and texts -> the templated prompt string)
and `TemplatedIds` (per pool's `kv_events`: the string's ids, its tokenizer loaded once).

How it is tokenized: as the engine's tokenizer does it. A Hugging Face tokenizer first cuts
the string at its special tokens (<|im_start|>, DeepSeek's User marker, ...) and tokenizes
each piece between them alone; so the ids here are each marker's id and each piece's ids,
a piece being a message's text with the template's text around it up to the next marker.
Pieces are kept by their digest (extproc.request.tokens.digest; LRU, up to `cache_tokens`
ids, 4 bytes each): a chat resends its history and a shared system prompt recurs, and only
what is new is tokenized. A new piece costs a count of it (the counter's per-message work,
once more); bench/results/kv-events/ measures it. Only plain chats
(InferenceRequest.chat_roles) are rendered: tools, tool calls and content parts render by
rules of each model's own.

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
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from extproc.request.tokens.digest import utf8_key
from extproc.request.tokens.native import FastokensBpe
from extproc.request.tokens.prompt import IdCounter, PromptCounter
from policy.domain import ChatTemplate, KvEvents

_BOS = "<\uff5cbegin\u2581of\u2581sentence\uff5c>"
_EOS = "<\uff5cend\u2581of\u2581sentence\uff5c>"
_USER = "<\uff5cUser\uff5c>"
_ASSISTANT = "<\uff5cAssistant\uff5c>"
_NONE = np.zeros(0, dtype=np.uint32)
_DIGEST_MIN_BYTES = 256  # the counter's _CACHED_MIN_BYTES: longer texts come with its digest
_FRESH = 256  # texts counted and not yet asked for (a request's, or a few in flight)


def pieces(template: ChatTemplate, roles: Sequence[str], texts: Sequence[str]) -> list[str]:
    """The rendered chat, cut at its special markers: markers and the text between them,
    alternating, in order (a marker's entry is the marker itself)."""
    if template is ChatTemplate.CHATML:
        out: list[str] = []
        for role, text in zip(roles, texts, strict=True):
            out += ("<|im_start|>", f"{role}\n{text}", "<|im_end|>", "\n")
        return [*out, "<|im_start|>", "assistant\n"]
    system = "\n\n".join(text for role, text in zip(roles, texts, strict=True) if role == "system")
    out = [_BOS, system]
    for role, text in zip(roles, texts, strict=True):
        if role == "user":
            out += (_USER, text)
        elif role == "assistant":
            out += (_ASSISTANT, text, _EOS)
    out.append(_ASSISTANT)
    return out


def render(template: ChatTemplate, roles: Sequence[str], texts: Sequence[str]) -> str:
    return "".join(pieces(template, roles, texts))


class TemplatedIds:
    """The engine's ids of plain chats, per pool's tokenizer (the counter's own where the
    pool names none)."""

    def __init__(self, counter: PromptCounter, cache_tokens: int = 4_000_000) -> None:
        self._counter = counter
        self._tokenizers: dict[str, IdCounter] = {}
        self._lock = asyncio.Lock()
        self.cache_tokens = cache_tokens
        self._cache: OrderedDict[tuple[int, str | bytes], np.ndarray] = OrderedDict()
        self._cached_tokens = 0
        self._used = False  # asked for ids once: only then is the counter's work kept
        # Texts the counter just tokenized, by object: the request's own strings come back
        # as template pieces (DeepSeek's turns) without being hashed again.
        self._fresh: OrderedDict[int, tuple[str, np.ndarray]] = OrderedDict()
        counter.ids_to = self._counted

    def _counted(self, text: str, key: bytes | None, ids: np.ndarray) -> None:
        """The counter tokenized a message text (`key`: its digest, the cache's
        own, where it computed one): where the pool tokenizes with the counter's tokenizer
        and the text is a piece of its template by itself, its ids are these."""
        tokenizer = self._counter.id_counter
        if not self._used or tokenizer is None:
            return
        if ids.dtype != np.uint32:
            ids = ids.astype(np.uint32)
        self._fresh[id(text)] = (text, ids)
        while len(self._fresh) > _FRESH:
            self._fresh.popitem(last=False)
        self._keep((id(tokenizer), key if key is not None else _key(text)), ids)

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
        self._used = True
        parts = [
            self._piece(tokenizer, piece) for piece in pieces(config.chat_template, roles, texts)
        ]
        return np.concatenate(parts) if parts else np.zeros(0, dtype=np.uint32)

    def _piece(self, tokenizer: IdCounter, piece: str) -> np.ndarray:
        if not piece:
            return _NONE
        fresh = self._fresh.pop(id(piece), None)
        if fresh is not None and fresh[0] is piece and tokenizer is self._counter.id_counter:
            return fresh[1]
        key = (id(tokenizer), _key(piece))
        ids = self._cache.get(key)
        if ids is not None:
            self._cache.move_to_end(key)
            return ids
        return self._keep(key, tokenizer.token_ids(piece))

    def _keep(self, key: tuple[int, str | bytes], ids: np.ndarray) -> np.ndarray:
        if ids.dtype != np.uint32:
            ids = ids.astype(np.uint32)
        cache = self._cache
        old = cache.pop(key, None)
        if old is not None:
            self._cached_tokens -= int(old.shape[0])
        cache[key] = ids
        self._cached_tokens += int(ids.shape[0])
        while self._cached_tokens > self.cache_tokens and cache:
            _, dropped = cache.popitem(last=False)
            self._cached_tokens -= int(dropped.shape[0])
        return ids


def _key(text: str) -> str | bytes:
    """A piece as the cache keeps it: a short one (a marker, a role, a short turn) as itself,
    a long one by its digest (the counter's cache key for the same text)."""
    if len(text) * 4 < _DIGEST_MIN_BYTES:  # at most 4 bytes a character: short, not encoded
        return text
    _, digest = utf8_key(text, _DIGEST_MIN_BYTES)
    return text if digest is None else digest
