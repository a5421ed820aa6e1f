"""How many KV tokens a request will need, learned online per category.

A request holds its prompt plus its output in the KV cache by the time it ends. The prompt's token
count is estimated from its characters (the ratio learned from the server's usage reports, starting
at 4 characters a token); the output from the category's completions so far (starting at its
``max_tokens``: cautious until the first answers come back).
"""

from __future__ import annotations

from dataclasses import dataclass, field

CHARS_PER_TOKEN = 4.0
ALPHA = 0.05
"""EWMA weight of one completion: about the last 20-40 answers of a category count."""


@dataclass
class CategoryDemand:
    max_tokens: int
    completion_tokens: float | None = None
    chars_per_token: float = CHARS_PER_TOKEN
    completions: int = 0

    def projected(self, prompt_chars: int) -> float:
        output = self.max_tokens if self.completion_tokens is None else self.completion_tokens
        return prompt_chars / self.chars_per_token + min(output, self.max_tokens)

    def learn(self, prompt_chars: int, prompt_tokens: int, completion_tokens: int) -> None:
        self.completions += 1
        a = max(ALPHA, 1.0 / self.completions)  # plain mean for the first answers, then an EWMA
        if self.completion_tokens is None:
            self.completion_tokens = float(completion_tokens)
        else:
            self.completion_tokens += a * (completion_tokens - self.completion_tokens)
        if prompt_tokens > 0 and prompt_chars > 0:
            self.chars_per_token += a * (prompt_chars / prompt_tokens - self.chars_per_token)


@dataclass
class DemandModel:
    """Per-category projections shared by every endpoint's controller (the categories are the same)."""

    categories: dict[str, CategoryDemand] = field(default_factory=dict)

    def category(self, name: str, max_tokens: int) -> CategoryDemand:
        if name not in self.categories:
            self.categories[name] = CategoryDemand(max_tokens=max_tokens)
        return self.categories[name]
