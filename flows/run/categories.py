"""Each category's live state in a run: its settings, sampling, where its rows go, and its counts.

Categories share one dedup index: a prompt answered in one category is never asked again in another.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from flows.client.sampling import SamplingParams
from flows.config import CategoryConfig, RunConfig
from flows.control.demand import RECENT_ANSWERS
from flows.run.prompt_stream import StreamCounts
from flows.run.pump import CategorySink, Tally
from flows.run.suspects import convicted
from flows.store.run_store import CategoryState, RunStore, ShardWriter
from prompts.dedup import DedupIndex


@dataclass
class CategoryRun:
    """One category's live state in this run."""

    config: CategoryConfig
    sampling: SamplingParams
    sink: CategorySink
    counts: StreamCounts = field(default_factory=StreamCounts)


def sampling_for(config: RunConfig, category: CategoryConfig) -> SamplingParams:
    generation = config.generation_for(category)
    # generation_for merges over DEFAULT_GENERATION, which sets these three
    assert generation.max_tokens is not None and generation.temperature is not None
    assert generation.top_p is not None
    return SamplingParams(
        max_tokens=generation.max_tokens,
        temperature=generation.temperature,
        top_p=generation.top_p,
        chat_template_kwargs=generation.chat_template_kwargs,
        separate_reasoning=generation.separate_reasoning,
        extra_body=dict(generation.extra_body or {}),
    )


class Categories:
    """The run's categories, made on first use; what each already has on disk once ``load_states`` ran."""

    def __init__(self, config: RunConfig, store: RunStore) -> None:
        self.config = config
        self.store = store
        self.runs: dict[str, CategoryRun] = {}
        self.states: dict[str, CategoryState] = {}
        self.dedup = DedupIndex()
        self.loaded_at: float | None = None
        self.earlier_answers: dict[str, list[int]] = {}
        """Each category's latest answers before this start (an adaptive run's: ``CategoryDemand.seed``)."""
        self.convicted: dict[str, set[str]] = {}
        """Each category's prompts an earlier start rejected alone among suspects (``suspects.py``)
        and no start has answered since: this start asks each alone from the first."""

    def get(self, name: str) -> CategoryRun:
        if name not in self.runs:
            cfg = self.config.category(name)
            store = self.config.store
            sink = CategorySink(
                rows=self.store.row_writer(
                    name, flush_rows=store.flush_rows, flush_seconds=store.flush_seconds
                ),
                rejects=self.store.reject_writer(
                    name, flush_rows=store.flush_rows, flush_seconds=store.flush_seconds
                ),
                tally=Tally(),
            )
            self.runs[name] = CategoryRun(cfg, sampling_for(self.config, cfg), sink)
        return self.runs[name]

    def load_states(self) -> None:
        """Read what every category already has, and claim its prompts for cross-category dedup; the
        prompts an earlier start convicted, once here rather than at each shard (a run of thousands
        of shards read every retryable reject's reason at each); for an adaptive run, its latest
        answers' lengths too.

        All categories are read before any streams, so a prompt already answered in one category is
        never asked again in another on resume, whatever order the categories then run in. The index
        hashes with the run's key version (its manifest's), the version of the keys its rows hold.
        """
        self.loaded_at = time.monotonic()
        self.dedup = DedupIndex(self.store.prompt_key_version())
        for category in self.config.categories:
            state = self.store.category_state(category.name)
            self.states[category.name] = state
            for key in state.prompt_hashes:
                self.dedup.claim(key, category.name)
            self.convicted[category.name] = convicted(state.retryable_reasons) - state.row_ids
            if self.config.concurrency.adaptive and state.row_ids:
                max_tokens = sampling_for(self.config, category).max_tokens
                self.earlier_answers[category.name] = self.store.recent_answers(
                    category.name, max_tokens, RECENT_ANSWERS
                )

    def tallies(self) -> dict[str, Tally]:
        return {name: run.sink.tally for name, run in self.runs.items()}

    def writers(self) -> list[ShardWriter]:
        return [w for run in self.runs.values() for w in (run.sink.rows, run.sink.rejects)]
