"""Counting prompts: the fast BPE against the reference tokenizer, token for token; the rule
the request path applies (exact, cached per message, or the byte bound) and the per-key
correction; and why the fitted estimate no longer decides anything (the hostile corpus)."""

from __future__ import annotations

import asyncio
import json
import random
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from admission.decision import CountKind
from extproc.request.tokens.bpe import DeepSeekBpe, cut
from extproc.request.tokens.corrections import PromptCorrections
from extproc.request.tokens.fitted import fast_estimate
from extproc.request.tokens.native import FastokensBpe, exact_counter
from extproc.request.tokens.prompt import PromptCounter, SplittingCounter
from extproc.request.tokens.reference import ReferenceTokenizer
from policy.schema import CountingConfig
from tests.support.code_points import CONTEXTS, GOLDEN, digest, runs, tokenizer_digest

DATA_DIR = Path(__file__).parents[3] / "data"
Counter = DeepSeekBpe | FastokensBpe
NATURAL = sorted(DATA_DIR.glob("*.txt"))
HOSTILE = sorted((DATA_DIR / "hostile").glob("*.txt"))


@pytest.fixture(scope="module", params=["fastokens", "tiktoken"])
def bpe(request: pytest.FixtureRequest) -> Counter:
    """Both engines `counting.engine` can name: every exactness test holds for each."""
    return exact_counter(request.param)


@pytest.fixture(scope="module")
def reference() -> ReferenceTokenizer:
    return ReferenceTokenizer()


def test_the_hostile_corpus_is_there() -> None:
    assert len(HOSTILE) >= 25 and len(NATURAL) >= 4


@pytest.mark.parametrize("path", NATURAL + HOSTILE, ids=lambda p: p.stem)
def test_bpe_gives_the_reference_tokens(
    path: Path, bpe: Counter, reference: ReferenceTokenizer
) -> None:
    text = path.read_text(encoding="utf-8")
    assert bpe.ids(text) == reference.ids(text)


def _random_text(rng: random.Random) -> str:
    """Characters from every plane and category: letters of many scripts, marks, digits of
    other scripts, punctuation, symbols, spaces of every kind, controls, unassigned and
    private-use code points, lone surrogates."""
    pieces = []
    for _ in range(rng.randint(1, 30)):
        r = rng.random()
        if r < 0.25:
            code = rng.randint(0x20, 0x7E)
        elif r < 0.40:
            code = rng.randint(0x80, 0x7FF)
        elif r < 0.65:
            code = rng.randint(0x800, 0xFFFF)
        elif r < 0.75:
            code = ord(rng.choice(" \n\r\t\u3000\u00a0\x0b\x0c\x85\u2028\u2029\u1680\u200b\ufeff"))
        elif r < 0.85:
            code = rng.randint(0, 0x1F)
        else:
            code = rng.randint(0x10000, 0x10FFFF)
        pieces.append(chr(code))
    return "".join(pieces)


# One test per context, so that `make test-fast`'s two workers share the ~8 s of it.
@pytest.mark.parametrize("context", CONTEXTS)
def test_every_code_point_tokenizes_as_the_reference_tokenizes_it(
    reference: ReferenceTokenizer, context: str
) -> None:
    """The check that catches an engine's Unicode tables drifting from the reference's:
    gigatok 0.2.0 disagreed on the ~4,800 code points recent Unicode versions assigned,
    enough text to fool a count. For fastokens, the default engine, which is pinned for this reason
    (tiktoken passed it too when it was written: 79 s, too long to run every time). The
    reference's answer is the kept one of tests/support/code_points.py, for the very
    tokenizer.json it came from."""
    golden = json.loads(GOLDEN.read_text(encoding="utf-8"))
    assert golden["tokenizer_sha256"] == tokenizer_digest(), (
        "the tokenizer package's tokenizer.json changed: write the reference's answers "
        "again with `python -m tests.support.code_points`"
    )
    fast = exact_counter("fastokens")
    for run, want in zip(runs(context), golden["contexts"][context], strict=True):
        got = fast.ids(run)
        if digest(got) != want:
            wanted = reference.ids(run)
            assert got != wanted, "the kept answer is not the reference's: write it again"
            pairs = enumerate(zip(got, wanted, strict=False))
            at = next((i for i, (g, w) in pairs if g != w), min(len(got), len(wanted)))
            near = reference.tokenizer().decode(wanted[max(0, at - 3) : at + 3])
            pytest.fail(f"{context!r}: first difference at token {at}, near {near!r}")


def test_bpe_gives_the_reference_tokens_on_random_unicode(
    bpe: Counter, reference: ReferenceTokenizer
) -> None:
    rng = random.Random(20261201)
    for _ in range(6000):
        text = _random_text(rng)
        assert bpe.ids(text) == reference.ids(text), repr(text)


def test_special_tokens_in_text_count_as_the_reference_counts_them(
    bpe: Counter, reference: ReferenceTokenizer
) -> None:
    for text in (
        "a<\uff5cend\u2581of\u2581sentence\uff5c>b<\uff5cUser\uff5c>",
        "<think>reasoning</think> answer",
        "<|EOT|> and <|place_holder_mm_span_0021|>",
    ):
        assert bpe.ids(text) == reference.ids(text)
        assert bpe.count(text) < len(text)  # the markers are single tokens


@pytest.mark.parametrize("path", HOSTILE, ids=lambda p: p.stem)
def test_the_fitted_estimate_cannot_be_trusted_but_the_count_can(
    path: Path, bpe: Counter, reference: ReferenceTokenizer
) -> None:
    """The rule's bound, on every hostile text: the count is the real one (plus the template
    overhead), never below it; and the byte bound it falls back on is never below either."""
    text = path.read_text(encoding="utf-8")
    real = reference.count(text)
    counter = PromptCounter(bpe, CountingConfig(per_message_overhead_tokens=4))
    counted = asyncio.run(counter.count([text]))
    assert counted.exact and counted.tokens == real + 4
    assert len(text.encode("utf-8")) >= real  # byte-level BPE: at most one token per byte
    # What the estimate would have said instead: recorded in the accuracy benchmark.
    assert fast_estimate(text) > 0


def test_random_letters_fool_the_fitted_estimate_tenfold(reference: ReferenceTokenizer) -> None:
    text = (DATA_DIR / "hostile" / "random_mixed_case.txt").read_text()
    assert reference.count(text) > 9 * fast_estimate(text)


# --- the counting rule ---------------------------------------------------------------------


def counter_with(bpe: Counter | None, **settings: int) -> PromptCounter:
    config = CountingConfig(**settings)
    return PromptCounter(bpe, config, ThreadPoolExecutor(config.workers))


async def test_a_chat_that_resends_its_history_counts_only_the_new_message(
    bpe: Counter,
) -> None:
    counter = counter_with(bpe, per_message_overhead_tokens=3)
    history = [(DATA_DIR / "en_prose.txt").read_text(), (DATA_DIR / "code_sample.txt").read_text()]
    first = await counter.count(history)
    assert first.kind is CountKind.EXACT
    assert first.tokens == sum(bpe.count(t) for t in history) + 6
    again = await counter.count(history)
    assert again.kind is CountKind.CACHED and again.tokens == first.tokens
    turn = [*history, "And one more question about the second file?" * 10]
    grown = await counter.count(turn)
    assert grown.kind is CountKind.EXACT
    assert grown.tokens == first.tokens + bpe.count(turn[-1]) + 3
    assert counter.cache_size == 3


async def test_text_too_large_to_count_is_taken_at_one_token_per_byte(bpe: Counter) -> None:
    counter = counter_with(bpe, max_bytes=10_000)
    text = "x" * 20_000
    counted = await counter.count([text, "short"], token_ids=7)
    assert counted.kind is CountKind.BOUND
    assert counted.tokens == 20_000 + 5 + 7 + 2 * 4  # bytes, token ids, overhead


async def test_a_busy_counter_falls_back_on_the_byte_bound(bpe: Counter) -> None:
    counter = counter_with(bpe, queue_max_bytes=100_000, inline_max_bytes=0)
    counter.queued_bytes = 95_000  # others are being counted
    counted = await counter.count(["y" * 10_000])
    assert counted.kind is CountKind.BUSY and counted.tokens == 10_000 + 4
    counter.queued_bytes = 0
    assert (await counter.count(["y" * 10_000])).kind is CountKind.EXACT


async def test_concurrent_counts_are_off_the_loop_and_release_their_queue(
    bpe: Counter,
) -> None:
    counter = counter_with(bpe, inline_max_bytes=1024, workers=2)
    texts = [(DATA_DIR / "hostile" / p.name).read_text() for p in HOSTILE[:8]]
    counts = await asyncio.gather(*(counter.count([t]) for t in texts))
    assert [c.tokens for c in counts] == [bpe.count(t) + 4 for t in texts]
    assert counter.queued_bytes == 0


async def test_without_a_tokenizer_every_count_is_the_bound() -> None:
    counter = counter_with(None)
    counted = await counter.count(["hello world"])
    assert counted.kind is CountKind.BOUND and counted.tokens == len("hello world") + 4


async def test_lone_surrogates_are_counted_not_raised(bpe: Counter) -> None:
    counter = counter_with(bpe)
    counted = await counter.count(["broken \ud83d emoji " * 100])
    assert counted.exact and counted.tokens > 100


# --- per-key corrections -------------------------------------------------------------------


def test_a_key_whose_prompts_keep_exceeding_its_counts_is_corrected() -> None:
    corrections = PromptCorrections()
    assert not corrections.observe("k", counted=1000, engine=1040)  # the template: fine
    assert corrections.factor("k") == 1.0
    for _ in range(25):
        corrections.observe("k", counted=1000, engine=1500)
    # The template's slack off what the engine counted, then the ratio.
    expected = (1500 - PromptCorrections.slack_tokens) / 1000
    assert corrections.factor("k") == pytest.approx(expected, rel=0.02)
    assert corrections.factor("other") == 1.0
    for _ in range(30):
        corrections.observe("k", counted=1000, engine=20_000)
    assert corrections.factor("k") == PromptCorrections.max_factor
    for _ in range(40):
        corrections.observe("k", counted=1000, engine=1000)
    assert corrections.factor("k") == 1.0  # back in line: no correction


def test_a_chat_template_on_a_tiny_prompt_is_not_a_ratio() -> None:
    """Seen on a real vLLM: its template made a 5-token "hello" 17 tokens; the key's next
    8k-token prompt must not be charged 3.4x for it."""
    corrections = PromptCorrections()
    assert not corrections.observe("k", counted=5, engine=17)
    assert corrections.factor("k") == 1.0
    assert corrections.observe("k", counted=8000, engine=32_000)  # a real under-count still is
    assert corrections.factor("k") > PromptCorrections.tolerance


# --- a long text counted by all workers at once --------------------------------------------


def _spaced_random_text(rng: random.Random) -> str:
    """Random Unicode with the one thing a cut needs spread through it: ASCII letters on
    both sides of a space, next to digits, marks, CJK, punctuation and other spaces."""
    parts = []
    for _ in range(rng.randint(5, 60)):
        r = rng.random()
        if r < 0.5:
            parts.append(rng.choice(["a b", "Ab cD", "x  y", "q\tz", "é b", "a ́b", "1a b2"]))
        else:
            parts.append(_random_text(rng))
    return "".join(parts)


@pytest.mark.parametrize("path", NATURAL + HOSTILE, ids=lambda p: p.stem)
def test_a_text_cut_into_pieces_counts_as_the_whole(path: Path, bpe: Counter) -> None:
    text = path.read_text(encoding="utf-8")
    whole = bpe.count(text)
    for parts in (2, 3, 8):
        pieces = cut(text, parts)
        assert "".join(pieces) == text
        assert sum(bpe.count(p) for p in pieces) == whole, parts


def test_random_text_cut_into_pieces_counts_as_the_whole(bpe: Counter) -> None:
    rng = random.Random(20261202)
    were_cut = 0
    for _ in range(3000):
        text = _spaced_random_text(rng)
        pieces = cut(text, rng.randint(2, 6))
        were_cut += len(pieces) > 1
        assert "".join(pieces) == text
        assert sum(bpe.count(p) for p in pieces) == bpe.count(text), repr(text)
    assert were_cut > 2500  # the cuts were really made


def test_text_with_a_special_token_is_not_cut() -> None:
    text = "word " * 5000 + "<\uff5cUser\uff5c>" + " word" * 5000
    assert cut(text, 4) == [text]
    assert len(cut(text.replace("<\uff5cUser\uff5c>", "x"), 4)) == 4


class _Recording:
    """The BPE, remembering every text it was asked to count."""

    def __init__(self, bpe: Counter) -> None:
        self._bpe = bpe
        self.counted: list[int] = []

    def count(self, text: str) -> int:
        self.counted.append(len(text))
        return self._bpe.count(text)

    def pieces(self, text: str, parts: int) -> list[str]:
        return cut(text, parts)


async def test_a_long_text_is_counted_in_one_piece_per_worker(bpe: Counter) -> None:
    text = (DATA_DIR / "en_prose.txt").read_text() * 12
    assert len(text) >= 32768
    for split_min_bytes, calls in ((32768, 3), (0, 1)):
        recording = _Recording(bpe)
        config = CountingConfig(workers=3, split_min_bytes=split_min_bytes, inline_max_bytes=2048)
        counter = PromptCounter(recording, config, ThreadPoolExecutor(3))
        counted = await counter.count([text, "a short question"])
        assert counted.kind is CountKind.EXACT
        assert counted.tokens == bpe.count(text) + bpe.count("a short question") + 2 * 4
        assert sum(n > 1000 for n in recording.counted) == calls
        assert counter.queued_bytes == 0


async def test_fastokens_counts_a_long_text_whole_on_its_own_threads(bpe: Counter) -> None:
    """No cuts where the engine spreads a long text itself: cutting cost more there."""
    text = (DATA_DIR / "en_prose.txt").read_text() * 12
    counter = PromptCounter(bpe, CountingConfig(workers=3), ThreadPoolExecutor(3))
    counted = await counter.count([text])
    assert counted.tokens == bpe.count(text) + 4
    assert isinstance(bpe, SplittingCounter) == isinstance(bpe, DeepSeekBpe)


class _Refusing:
    """A fastokens tokenizer that refuses every text, as PCRE2 does past its limits."""

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        raise RuntimeError("match limit exceeded")


def test_text_fastokens_refuses_is_counted_by_tiktoken(reference: ReferenceTokenizer) -> None:
    fast = exact_counter("fastokens")
    assert isinstance(fast, FastokensBpe)
    text = (DATA_DIR / "en_prose.txt").read_text()
    assert fast._fallback is None  # tiktoken is loaded only when it is needed
    fast._tokenizer = _Refusing()  # type: ignore[assignment]
    assert fast.count(text) == reference.count(text)


def test_an_unknown_engine_is_refused() -> None:
    with pytest.raises(ValueError, match="no counting engine"):
        exact_counter("sentencepiece")


class _CountingExecutor(ThreadPoolExecutor):
    """A thread pool that counts what it is handed."""

    def __init__(self) -> None:
        super().__init__(2)
        self.jobs = 0

    def submit(self, *args: Any, **kwargs: Any) -> Any:
        self.jobs += 1
        return super().submit(*args, **kwargs)


async def test_mostly_ascii_text_up_to_64_kib_is_counted_on_the_loop_unless_the_engine_is_slow(
    bpe: Counter,
) -> None:
    # English as users write it: curly quotes and dashes make it not ASCII, but mostly so.
    ascii_text = ((DATA_DIR / "en_prose.txt").read_text() * 20)[
        :59_000
    ] + "\u201cquoted\u201d \u2014 "
    hanzi = "".join(chr(0x4E00 + (i * 7919) % 20000) for i in range(3000))  # ~9 KB
    assert not ascii_text.isascii() and len(hanzi.encode()) > 4096
    pool = _CountingExecutor()
    counter = PromptCounter(bpe, CountingConfig(), pool)
    assert (await counter.count([ascii_text])).tokens == bpe.count(ascii_text) + 4
    # tiktoken: capped at 2 KiB, and this text is long enough to be cut for both workers
    assert pool.jobs == (2 if isinstance(bpe, DeepSeekBpe) else 0)
    before = pool.jobs
    assert (await counter.count([hanzi])).tokens == bpe.count(hanzi) + 4
    assert pool.jobs == before + 1  # other text: on the loop only up to 4 KiB
