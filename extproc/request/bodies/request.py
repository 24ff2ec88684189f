"""What slogate reads out of any inference body, whichever API it came in.

What lives here: `InferenceRequest` (the fields routing, budgets and admission need, the
same for every API) and `collect_texts`, the walk that pulls the countable text out of the
free-form items of the Responses and Messages APIs. Parsing each API is its own module
(`openai`, `responses`, `anthropic`); no token counting and no policy here.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from policy.apis import BodyShape

# Members of an input item that name its structure, not its content: never prompt text.
_STRUCTURAL_KEYS = frozenset(
    {"type", "role", "id", "call_id", "status", "format", "media_type", "cache_control"}
)


@dataclass(frozen=True, slots=True)
class InferenceRequest:
    """The parts of one inference body that routing and budgets need."""

    shape: BodyShape  # what was read (an /invocations payload resolves to CHAT or COMPLETION)
    model: str | None
    prompt_texts: tuple[str, ...]  # one entry per message / prompt / item, in order
    prompt_token_ids: int  # prompts already given as token ids (exact count)
    max_tokens: int | None  # per completion, as the client named it; None: not named
    sequences: int = 1  # completions generated at once: n, best_of, beam width, batched prompts
    stream: bool = False
    wants_usage: bool = False  # stream_options.include_usage already true
    has_stream_options: bool = False
    # The output-limit member is present (perhaps null): writing one must not add a duplicate.
    has_limit_member: bool = False
    # Generation runs to max_tokens whatever the model does (ignore_eos, min_tokens >= max).
    runs_to_limit: bool = False
    generates: bool = True  # False: embeddings (the prompt is all there is)
    # The body names vLLM's scheduling `priority`: slogate replaces it (the tier decides)
    # or removes it (the pool does not schedule by priority).
    has_priority: bool = False
    # The leading prompt texts every turn of its conversation resends (the system prompt
    # and the first user message): the engine picker's conversation key is hashed
    # through them (engines.prefix).
    conversation_texts: int = 1
    # A plain chat (every message's content one string; no tools, tool calls or other
    # parts): each prompt text's role, for rendering the chat template the engine applies
    # (extproc.request.tokens.templated). Empty otherwise.
    chat_roles: tuple[str, ...] = ()

    @property
    def prompt_chars(self) -> int:
        return sum(len(t) for t in self.prompt_texts)


def collect_texts(value: object) -> Iterator[str]:
    """Every string inside a decoded JSON value except structural members (type, role, ids):
    content parts, tool arguments and results, reasoning summaries. Counting a little too
    much (a tool name) only makes a request look dearer; counting too little lets it past a
    limit."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            if item:
                yield item
        elif isinstance(item, dict):
            stack.extend(v for k, v in reversed(item.items()) if k not in _STRUCTURAL_KEYS)
        elif isinstance(item, list):
            stack.extend(reversed(item))
