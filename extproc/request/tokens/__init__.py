"""Counting prompt tokens: exactly, with DeepSeek's tokenizer on fastokens (`native`) or on
tiktoken (`bpe`), checked against the reference tokenizer (`reference`); the rule the
request path applies (`prompt`); the per-key correction from settled usage
(`corrections`); and the fitted estimate the benchmarks still report (`fitted`)."""

from extproc.request.tokens.bpe import DeepSeekBpe
from extproc.request.tokens.corrections import PromptCorrections
from extproc.request.tokens.fitted import TextFeatures, fast_estimate, text_features, upper_estimate
from extproc.request.tokens.native import FastokensBpe, exact_counter
from extproc.request.tokens.prompt import CountKind, PromptCount, PromptCounter, TokenCounter
from extproc.request.tokens.reference import ReferenceTokenizer, default_tokenizer_path

__all__ = [
    "CountKind",
    "DeepSeekBpe",
    "FastokensBpe",
    "PromptCorrections",
    "PromptCount",
    "PromptCounter",
    "ReferenceTokenizer",
    "TextFeatures",
    "TokenCounter",
    "default_tokenizer_path",
    "exact_counter",
    "fast_estimate",
    "text_features",
    "upper_estimate",
]
