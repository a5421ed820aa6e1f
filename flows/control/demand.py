"""How many KV tokens a request will need, learned online per category.

A request holds its prompt plus its output in the KV cache by the time it ends. The prompt's token
count is estimated from its characters (the ratio learned from the server's usage reports, starting
at 4 characters a token); the output from the lengths of the category's answers so far
(``lengths.py``), each weighing ``1 - ALPHA`` less per newer answer, after ``PRIOR_ANSWERS`` answers
at ``max_tokens`` (or ``lengths.PRIOR_CLIP``, the fewer) that fade by ``PRIOR_DECAY`` per answer.
The prior matters: the first answers to come back are the shortest ones (a long answer is still
running), so their lengths alone would project far too little and open the budget wide at the start
of a run. It must also fade: a prior held at 20 / (answers + 20), as the mean once had it, still put
6 % of the answers at ``max_tokens`` after 300, and for a request that had already run long that was
a fifth of its chances of running on (the projection of answers of spread lengths ran 4-13 % above
what came, offline).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from flows.control.lengths import AnswerLengths, Floats
from flows.control.outlook import Cohort

CHARS_PER_TOKEN = 4.0
ALPHA = 0.05
"""Weight of the newest answer against the rest: about the last 20-40 answers of a category count."""
PRIOR_ANSWERS = 20
PRIOR_DECAY = 0.98
"""The prior fades by this much per answer: over the first 50 answers (the first requests' answers,
the short ones first) it weighs about what 20 / (answers + 20) did, then it is gone (1.7 % after
200, 0.03 % after 400). Faded as fast as the answers' own weights (0.95), it left the first
requests' young ones to end early: twice the retractions in the first 10 s of a run on the real
SGLang (bench/README.md, fifteenth session)."""
Chars = TypeVar("Chars", float, Floats)
RECENT_ANSWERS = 128
"""Answers kept for the lengths' distribution: at ``ALPHA`` the oldest weighs 0.1 % of the newest."""


@dataclass
class CategoryDemand:
    max_tokens: int
    chars_per_token: float = CHARS_PER_TOKEN
    completions: int = 0
    recent: deque[int] = field(default_factory=lambda: deque(maxlen=RECENT_ANSWERS))
    """The last answers' output tokens, oldest first."""
    earlier: int = 0
    """Answers of the run's earlier starts among ``recent`` (``seed``): they fade the prior as this
    start's own answers do."""
    _lengths: AnswerLengths | None = field(default=None, init=False, repr=False)

    def expected_output(self) -> float:
        return self.lengths().mean()

    def lengths(self) -> AnswerLengths:
        """The answers' lengths so far, each weighing ``1 - ALPHA`` less per newer answer, after
        ``PRIOR_ANSWERS`` at ``max_tokens`` (at most ``PRIOR_CLIP``) fading by ``PRIOR_DECAY`` per
        answer (one snapshot between two answers: every request in flight of the category shares
        it)."""
        if self._lengths is None:
            prior = PRIOR_ANSWERS * PRIOR_DECAY ** (self.completions + self.earlier)
            self._lengths = AnswerLengths.learn(self.recent, 1.0 - ALPHA, self.max_tokens, prior)
        return self._lengths

    def prompt_tokens(self, prompt_chars: Chars) -> Chars:
        """Tokens the server will count for prompts of this many characters (an array: each's)."""
        return prompt_chars / self.chars_per_token

    def cohort(self, prompt_chars: Floats, age_s: Floats, made_tokens: Floats) -> Cohort:
        """This category's requests in flight for the outlook, from their prompts' characters, ages
        and tokens made: read afresh at every projection, since what it expects is learned while
        they run."""
        return Cohort(
            self.prompt_tokens(prompt_chars),
            age_s,
            made_tokens,
            self.expected_output(),
            self.max_tokens,
            self.lengths(),
        )

    def seed(self, answers: Sequence[int]) -> None:
        """Start from the lengths of the run's latest answers before this start (oldest first, read
        from its rows: ``RunStore.recent_answers``), as if this start had learned them.

        Without them a resume, like a fresh run, counts every request at its cap (or ``PRIOR_CLIP``)
        until about fifty answers have come back: a batch of answers averaging half their cap ran
        half what fits for the first request lives of every start. The prompts' ratio of characters
        to tokens is not seeded (the rows do not keep the characters sent): the first answer of this
        start sets it, as in a fresh run."""
        self.recent.extend(answers)
        self.earlier = min(len(answers), RECENT_ANSWERS)
        self._lengths = None

    def learn(self, prompt_chars: int, prompt_tokens: int, completion_tokens: int) -> None:
        self.completions += 1
        self.recent.append(completion_tokens)
        self._lengths = None
        a = max(ALPHA, 1.0 / self.completions)  # plain mean for the first answers, then an EWMA
        if prompt_tokens > 0 and prompt_chars > 0:
            self.chars_per_token += a * (prompt_chars / prompt_tokens - self.chars_per_token)


@dataclass
class DemandModel:
    """Per-category projections shared by every endpoint's controller (the categories are the same)."""

    categories: dict[str, CategoryDemand] = field(default_factory=dict)

    def category(self, name: str, max_tokens: int, earlier: Sequence[int] = ()) -> CategoryDemand:
        """The category's demand, made on first use from the ``earlier`` answers of the run (``seed``)."""
        if name not in self.categories:
            self.categories[name] = CategoryDemand(max_tokens=max_tokens)
            self.categories[name].seed(earlier)
        return self.categories[name]
