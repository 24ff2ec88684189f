"""extproc.request.tokens.templated: a plain chat rendered as the engine's template renders it,
tokenized by the pool's tokenizer (the tiny model's ChatML one here: tooling/stack/tiny_model)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from extproc.request.bodies.openai import read_chat
from extproc.request.tokens.prompt import PromptCounter
from extproc.request.tokens.templated import TemplatedIds, render
from policy.domain import ChatTemplate, KvEvents
from policy.schema import CountingConfig


def test_chatml_renders_as_the_tiny_models_template() -> None:
    jinja2 = pytest.importorskip("jinja2")
    from tooling.stack.tiny_model import CHAT_TEMPLATE

    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    expected = jinja2.Template(CHAT_TEMPLATE).render(messages=messages, add_generation_prompt=True)
    roles = [m["role"] for m in messages]
    assert render(ChatTemplate.CHATML, roles, [m["content"] for m in messages]) == expected


def test_deepseek_renders_its_markers() -> None:
    text = render(
        ChatTemplate.DEEPSEEK, ["system", "user", "assistant", "user"], ["S", "A", "B", "C"]
    )
    assert text == (
        "<\uff5cbegin\u2581of\u2581sentence\uff5c>S<\uff5cUser\uff5c>A<\uff5cAssistant\uff5c>B"
        "<\uff5cend\u2581of\u2581sentence\uff5c><\uff5cUser\uff5c>C<\uff5cAssistant\uff5c>"
    )


def test_only_plain_chats_have_roles() -> None:
    plain = read_chat(
        b'{"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]}'
    )
    assert plain.chat_roles == ("system", "user")
    parts = read_chat(
        b'{"messages": [{"role": "user", "content": [{"type": "text", "text": "u"}]}]}'
    )
    tools = read_chat(
        b'{"messages": [{"role": "user", "content": "u"}], "tools": [{"type": "function"}]}'
    )
    assert parts.chat_roles == () and tools.chat_roles == ()


def tiny_tokenizer(path: Path) -> Path:
    """The tiny model's tokenizer alone (tooling.stack.tiny_model.build without torch)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    from tooling.stack.tiny_model import SPECIAL, VOCABULARY, corpus

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCABULARY, special_tokens=list(SPECIAL), initial_alphabet=alphabet
    )
    bpe.train_from_iterator(corpus(2_000), trainer=trainer)
    bpe.save(str(path))
    return path


async def test_ids_with_the_pools_tokenizer(tmp_path: Path) -> None:
    path = tiny_tokenizer(tmp_path / "tokenizer.json")
    ids = TemplatedIds(PromptCounter(None, CountingConfig()))
    config = KvEvents(tokenizer=str(path), chat_template=ChatTemplate.CHATML)
    got = await ids.ids(("user",), ("the fleet serves tokens",), config)
    # <|im_start|> and <|im_end|> as their special tokens (1, 2), never spelled out in bytes.
    assert got is not None and got[0] == 1 and list(got).count(2) == 1
    assert await ids.ids(("user",), ("x",), KvEvents()) is None  # no counter that gives ids


async def test_pieces_tokenize_as_the_whole_string(tmp_path: Path) -> None:
    """Cut at the markers, as the tokenizer itself cuts: the same ids as the rendered string
    (a text starting or ending in white space, which would merge across a cut elsewhere)."""
    from extproc.request.tokens.native import FastokensBpe

    path = tiny_tokenizer(tmp_path / "tokenizer.json")
    whole = FastokensBpe(path)
    ids = TemplatedIds(PromptCounter(None, CountingConfig()), cache_tokens=50)
    config = KvEvents(tokenizer=str(path), chat_template=ChatTemplate.CHATML)
    roles = ("system", "user", "assistant", "user")
    texts = ("\n  the fleet\n", " serves tokens ", "\n\nqueue", "budgets hold. " * 20)
    for _ in range(2):  # the second time from the cache (bounded: some pieces dropped)
        got = await ids.ids(roles, texts, config)
        assert got is not None
        assert got.tolist() == whole.token_ids(render(ChatTemplate.CHATML, roles, texts)).tolist()


class CountingCalls:
    """slogate's DeepSeek tokenizer, counting the texts it tokenizes."""

    def __init__(self) -> None:
        from extproc.request.tokens.native import FastokensBpe

        self.bpe = FastokensBpe()
        self.texts: list[str] = []

    def count(self, text: str) -> int:
        return self.bpe.count(text)

    def token_ids(self, text: str) -> np.ndarray:
        self.texts.append(text)
        return self.bpe.token_ids(text)


async def test_the_counters_ids_are_not_tokenized_again() -> None:
    """A DeepSeek pool with the counter's tokenizer: each new message is tokenized once,
    by the count; the templated ids are still the whole rendered string's."""
    tokenizer = CountingCalls()
    counter = PromptCounter(tokenizer, CountingConfig())
    templated = TemplatedIds(counter)
    roles = ("system", "user")
    texts = ("You answer. " * 50, "What is the fleet? " * 40)
    config = KvEvents()
    await templated.ids(roles, texts, config)  # the first use: the counter's work kept from now
    texts = (texts[0], "And the queue? " * 40)
    tokenizer.texts.clear()
    await counter.count(texts, block_tokens=64)
    got = await templated.ids(roles, texts, config)
    assert got is not None
    assert tokenizer.texts.count(texts[1]) == 1  # by the count, not again
    expected = tokenizer.bpe.token_ids(render(ChatTemplate.DEEPSEEK, roles, texts))
    assert got.tolist() == expected.tolist()
