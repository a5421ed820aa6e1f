"""How many KV tokens a request will need, learned online per category.

A request holds its prompt plus its output in the KV cache by the time it ends. The prompt's token
count is estimated from its characters (the ratio learned from the server's usage reports, starting
at 4 characters a token); the output from the category's completions so far, blended with its
``max_tokens`` as a prior worth ``PRIOR_ANSWERS`` answers. The prior matters: the first answers to
come back are the shortest ones (a long answer is still running), so their mean alone would
project far too little and open the budget wide at the start of a run.
"""

from __future__ import annotations

from dataclasses import dataclass, field

CHARS_PER_TOKEN = 4.0
ALPHA = 0.05
"""EWMA weight of one completion: about the last 20-40 answers of a category count."""
PRIOR_ANSWERS = 20


@dataclass
class CategoryDemand:
    max_tokens: int
    completion_tokens: float | None = None
    chars_per_token: float = CHARS_PER_TOKEN
    completions: int = 0

    def expected_output(self) -> float:
        if self.completion_tokens is None:
            return float(self.max_tokens)
        learned = min(self.completion_tokens, self.max_tokens)
        return (self.completions * learned + PRIOR_ANSWERS * self.max_tokens) / (
            self.completions + PRIOR_ANSWERS
        )

    def prompt_tokens(self, prompt_chars: int) -> float:
        return prompt_chars / self.chars_per_token

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
