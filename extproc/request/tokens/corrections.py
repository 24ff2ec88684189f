"""Per key: does the engine keep counting more prompt tokens than slogate did?

What lives here: `PromptCorrections`, pure and clock-free. After each settled request it
compares the engine's `prompt_tokens` with the count the request was admitted on (an exact
count of the message texts plus the template overhead). Exact counts differ from the
engine's only by its chat template, tools rendering and the like, so the ratio stays near
1; a key whose ratio stays above `tolerance` (an engine template heavier than the overhead
allows, inputs slogate does not see such as images, or a count slogate got wrong) has its
later counts multiplied by that ratio (at most `max_factor`), so admission and routing stop
under-counting it. Counts the byte bound decided are over the real one and teach nothing.

The template's share is not a ratio but a few tokens per request: a real vLLM's ChatML
template made a 5-token "hello" 17 tokens (3.4x), and taking that as the key's ratio
multiplied its next 8k-token prompt by 3.4. So the first `slack_tokens` of what the engine
counts beyond slogate's count are the template's, and only the rest is compared.
"""

from __future__ import annotations


class PromptCorrections:
    alpha = 0.2  # weight of the newest request in the running ratio
    tolerance = 1.1  # the engine counting up to 10% more is the template, not a problem
    max_factor = 4.0
    slack_tokens = 64  # per request: a chat template's tokens that slogate's overhead missed

    def __init__(self) -> None:
        self._ratio: dict[str, float] = {}  # key id -> running engine / counted ratio

    def observe(self, key_id: str, counted: int, engine: int) -> bool:
        """Record one settled request; True when it was under-counted beyond tolerance."""
        if counted <= 0 or engine <= 0:
            return False
        if engine >= counted:
            ratio = max(1.0, (engine - self.slack_tokens) / counted)
        else:
            ratio = engine / counted  # over-counted: brings a corrected key back down
        current = self._ratio.get(key_id)
        self._ratio[key_id] = ratio if current is None else current + self.alpha * (ratio - current)
        return ratio > self.tolerance

    def factor(self, key_id: str) -> float:
        """What this key's next counts are multiplied by: 1.0 unless it stays under-counted."""
        ratio = self._ratio.get(key_id)
        if ratio is None or ratio <= self.tolerance:
            return 1.0
        return min(self.max_factor, ratio)

    def largest(self, key_ids: list[str]) -> float:
        return max((self.factor(k) for k in key_ids), default=1.0)
