"""Request bodies at the sizes users send, for the benchmarks.

What lives here: `PROFILES`, named body mixes, and `profile_bodies`, which builds each mix
from text on this machine (Python's documentation, stdlib source, the Chinese samples; the
hostile corpus of tests/data/hostile/) sized by the real tokenizer:

- field_mix: the field's 70% ~4k + 25% ~8k + 5% ~32k-token chat prompts;
- 1k, 8k, 32k, 128k: one size each;
- multi_turn: a 10-turn chat that resends its history, one new question per request;
- chinese, code: ~4k-token prompts of each;
- hostile: ~4k-token-sized texts from the hostile corpus (random letters, base64, ...).

Every request's last message starts with its own number, so no two requests of a
single-shot mix are alike (a real prompt is counted once, not served from the count cache);
in multi_turn only the history repeats, as in a real chat.
"""

from __future__ import annotations

import json
import sysconfig
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from extproc.request.tokens.bpe import DeepSeekBpe

REPO = Path(__file__).resolve().parents[2]
DATA = REPO / "tests" / "data"


@dataclass(frozen=True, slots=True)
class Profile:
    name: str
    describe: str
    build: Callable[[DeepSeekBpe], list[list[dict[str, str]]]]  # message lists to cycle


def _english() -> str:
    import pydoc_data.topics

    return "\n\n".join(text for _, text in sorted(pydoc_data.topics.topics.items()))


def _code() -> str:
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    return "\n\n".join(p.read_text("utf-8", "replace") for p in sorted(stdlib.glob("*.py"))[:80])


def _chinese() -> str:
    return (DATA / "zh_hans_prose.txt").read_text("utf-8") + (DATA / "zh_hant_prose.txt").read_text(
        "utf-8"
    )


def _sized(bpe: DeepSeekBpe, source: str, tokens: int, offset: int) -> str:
    """A slice of `source` (repeated as needed) of about `tokens` tokens, from `offset`."""
    sample = source[:100_000]
    chars = int(tokens * len(sample) / max(1, bpe.count(sample)))
    text = (source * (chars // len(source) + 2))[offset % len(source) :][:chars]
    for _ in range(8):  # close in on the size with the real count
        count = bpe.count(text)
        if abs(count - tokens) <= tokens * 0.02:
            break
        chars = int(len(text) * tokens / max(1, count))
        text = (source * (chars // len(source) + 2))[offset % len(source) :][:chars]
    return text


def _single(
    source: Callable[[], str], sizes: list[int]
) -> Callable[[DeepSeekBpe], list[list[dict[str, str]]]]:
    def build(bpe: DeepSeekBpe) -> list[list[dict[str, str]]]:
        text = source()
        return [
            [{"role": "user", "content": _sized(bpe, text, size, 7919 * i)}]
            for i, size in enumerate(sizes)
        ]

    return build


def _multi_turn(bpe: DeepSeekBpe) -> list[list[dict[str, str]]]:
    text = _english()
    history: list[dict[str, str]] = [{"role": "system", "content": "You answer questions."}]
    for turn in range(10):
        history.append({"role": "user", "content": _sized(bpe, text, 250, 1000 * turn)})
        history.append(
            {"role": "assistant", "content": _sized(bpe, text, 150, 50_000 + 1000 * turn)}
        )
    return [[*history, {"role": "user", "content": "And the next question, please."}]]


def _hostile(bpe: DeepSeekBpe) -> list[list[dict[str, str]]]:
    texts = []
    for path in sorted((DATA / "hostile").glob("*.txt")):
        text = path.read_text("utf-8")
        if text.strip():
            texts.append([{"role": "user", "content": (text * 2)[:16_384]}])
    return texts


# 70% 4k, 25% 8k, 5% 32k: 20 prompts in that proportion, cycled.
_FIELD = [4096] * 14 + [8192] * 5 + [32768]
PROFILES: dict[str, Profile] = {
    p.name: p
    for p in (
        Profile(
            "field_mix", "70% ~4k + 25% ~8k + 5% ~32k tokens, English", _single(_english, _FIELD)
        ),
        Profile("1k", "~1k tokens, English", _single(_english, [1024] * 4)),
        Profile("4k", "~4k tokens, English", _single(_english, [4096] * 4)),
        Profile("8k", "~8k tokens, English", _single(_english, [8192] * 4)),
        Profile("32k", "~32k tokens, English", _single(_english, [32768] * 2)),
        Profile("128k", "~120k tokens, English", _single(_english, [120_000])),
        Profile("multi_turn", "10-turn chat (~4k tokens of history) + a new question", _multi_turn),
        Profile("chinese", "~4k tokens, Chinese", _single(_chinese, [4096] * 4)),
        Profile("code", "~4k tokens, Python source", _single(_code, [4096] * 4)),
        Profile(
            "hostile", "16 KB of each hostile-corpus kind (random letters, base64, ...)", _hostile
        ),
    )
}


def body(messages: list[dict[str, str]], serial: int, max_tokens: int = 64) -> dict[str, object]:
    """One request: the messages with the last one made unique by `serial`."""
    last = {**messages[-1], "content": f"[{serial}] " + messages[-1]["content"]}
    return {"model": "deepseek-v4", "messages": [*messages[:-1], last], "max_tokens": max_tokens}


def profile_bodies(name: str, bpe: DeepSeekBpe) -> Iterator[dict[str, object]]:
    """Endless request bodies of one profile."""
    prompts = PROFILES[name].build(bpe)
    serial = 0
    while True:
        for messages in prompts:
            serial += 1
            yield body(messages, serial)


def body_templates(name: str, bpe: DeepSeekBpe) -> list[str]:
    """The profile's bodies as JSON with a `__SERIAL__` marker where each request puts its
    number (wrk's Lua script fills it in, so every request is new to the count cache)."""
    return [
        json.dumps(body(messages, 0)).replace('"[0] ', '"[__SERIAL__] ', 1)
        for messages in PROFILES[name].build(bpe)
    ]
