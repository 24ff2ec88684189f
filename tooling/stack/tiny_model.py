"""A tiny random-weight chat model made here, for a real vLLM to serve with no download.

What lives here: `build(folder)`, which trains a byte-level BPE tokenizer on text generated
from a fixed seed (so every machine makes the same vocabulary), wraps it with a ChatML chat
template, and saves it beside a 2-layer Llama with random bf16 weights. Run as
`python -m tooling.stack.tiny_model FOLDER` by tooling.stack.vllm_engine, in a child process:
torch and transformers (vLLM's extra) are then never imported into slogate's own processes.

The model answers gibberish and rarely emits EOS (generations run to max_tokens); what it
is for is real vLLM scheduling, KV cache, metrics and response shapes on a CPU.
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path
from typing import Any

# Bumped when what `build` makes changes: tooling.stack.vllm_engine rebuilds a cached folder
# whose stamp differs.
VERSION = "1"
STAMP = "slogate-tiny-model.json"
VOCABULARY = 2048
MAX_POSITIONS = 32768
SPECIAL = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")

# ChatML, as Qwen-style chat models use it; vLLM reads chat_template.jinja from the folder.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

_TEXT = (
    "the fleet serves tokens under load while budgets hold and breakers watch the tail "
    "latency so every tenant keeps its service level objective across pools of engines that "
    "share one cache of keys and values per request prompt context window model output "
    "stream first token time queue batch slot prefill decode memory block scheduler priority "
    "critical standard sheddable refuse admit retry after limit minute hour day error answer"
)

# What the tokenizer was trained on: N of these words are about N tokens to it (benchmarks
# size their prompts with them).
WORDS = tuple(_TEXT.split())


def corpus(lines: int = 20_000, seed: int = 13) -> list[str]:
    """Sentences of the words above, digits, punctuation and some non-Latin text."""
    rng = random.Random(seed)
    words_of = _TEXT.split()
    extra = ["42", "3.14", "2026-12-01", "x = f(y)", "{'a': 1}", "数据", "模型", "Привет", "ñandú"]
    out = []
    for _ in range(lines):
        words = [rng.choice(words_of) for _ in range(rng.randint(4, 24))]
        if rng.random() < 0.3:
            words.insert(rng.randrange(len(words)), rng.choice(extra))
        out.append(" ".join(words).capitalize() + rng.choice(".!?,;:"))
    return out


def build(folder: Path) -> Path:
    """Make the model in `folder` (created); returns it. Takes ~10 s (torch import most)."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    folder.mkdir(parents=True, exist_ok=True)
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCABULARY,
        special_tokens=list(SPECIAL),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    bpe.train_from_iterator(corpus(), trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        bos_token=None,
        model_max_length=MAX_POSITIONS,
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(folder)
    (folder / "chat_template.jinja").write_text(CHAT_TEMPLATE, encoding="utf-8")

    torch.manual_seed(13)
    # Any: what mypy sees of transformers differs with and without the vllm extra.
    settings: dict[str, Any] = dict(
        vocab_size=len(tokenizer),
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        max_position_embeddings=MAX_POSITIONS,
        eos_token_id=tokenizer.convert_tokens_to_ids("<|im_end|>"),
        pad_token_id=tokenizer.convert_tokens_to_ids("<|endoftext|>"),
        bos_token_id=None,
        tie_word_embeddings=True,
    )
    model: Any = LlamaForCausalLM(LlamaConfig(**settings))
    model = model.to(torch.bfloat16)
    model.save_pretrained(folder)
    (folder / STAMP).write_text(json.dumps({"version": VERSION}), encoding="utf-8")
    return folder


def is_built(folder: Path) -> bool:
    try:
        stamp = json.loads((folder / STAMP).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(stamp, dict) and stamp.get("version") == VERSION


if __name__ == "__main__":
    print(build(Path(sys.argv[1])))
