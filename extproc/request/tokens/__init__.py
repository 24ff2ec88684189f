"""Counting prompt tokens.

What lives here:
- `native`       DeepSeek's tokenizer on fastokens (`FastokensBpe`), the request path's exact
                 counter, and `exact_counter`, which picks the engine `counting.engine` names.
- `bpe`          the same tokenizer on tiktoken (`DeepSeekBpe`).
- `reference`    the reference tokenizer both are checked against (`ReferenceTokenizer`,
                 `default_tokenizer_path`).
- `prompt`       the rule the request path applies (`PromptCounter`, `PromptCount`, the
                 `TokenCounter` protocol).
- `corrections`  the per-key correction from settled usage (`PromptCorrections`).
- `fitted`       the fitted estimate the benchmarks still report (`fast_estimate`,
                 `upper_estimate`, `text_features`).

Names are imported from the module that defines them.
"""
