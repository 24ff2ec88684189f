"""Counting prompt tokens: exactly, with DeepSeek's vocabulary (`bpe`), checked against the
reference tokenizer (`reference`); the rule the request path applies (`prompt`); the
per-key correction from settled usage (`corrections`); and the fitted estimate the
benchmarks still report (`fitted`)."""

from extproc.tokens.bpe import DeepSeekBpe
from extproc.tokens.corrections import PromptCorrections
from extproc.tokens.fitted import TextFeatures, fast_estimate, text_features, upper_estimate
from extproc.tokens.prompt import CountKind, PromptCount, PromptCounter
from extproc.tokens.reference import ReferenceTokenizer, default_tokenizer_path

__all__ = [
    "CountKind",
    "DeepSeekBpe",
    "PromptCorrections",
    "PromptCount",
    "PromptCounter",
    "ReferenceTokenizer",
    "TextFeatures",
    "default_tokenizer_path",
    "fast_estimate",
    "text_features",
    "upper_estimate",
]
