"""Converter and row filter for nvidia/OpenCodeInstruct.

Every column of the dataset is a string, including the numeric and list-like ones
(``average_test_score`` "0.8", ``tests_execution_status`` '["pass", "fail"]', ``llm_judgement`` a
JSON object of ``{"<criterion>": {"score": 4, "justification": ...}}``). The filter parses them
itself and turns anything unparsable into a reject reason rather than an exception, because one
bad row among millions must be counted and explained, not stop a run.

Filtering and converting are separate steps: the pipeline applies ``OpenCodeInstructFilter`` first
(so it can count the rows surviving each check and record why the others went), then converts.
"""

from __future__ import annotations

import ast
import difflib
import json
import math
from collections.abc import Callable, Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from prompts.errors import ConversionError
from prompts.formats import Converted, register

Row = Mapping[str, Any]

JUDGEMENT_CRITERIA = ("requirement_conformance", "logical_correctness", "edge_case_consideration")
"""The criteria OpenCodeInstruct's ``llm_judgement`` scores (1-5 each)."""


def _as_float(value: Any) -> float | None:
    """A finite number from a number or numeric string; None for anything else (bools included)."""
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        return None
    try:
        number = float(value)
    except ValueError:
        return None
    return number if math.isfinite(number) else None


def _literal(value: Any) -> Any:
    """A stringly-typed list/dict column parsed as JSON, else as a Python literal; None if neither.

    Both spellings occur in dumps of this dataset (``'["pass"]'`` and ``"['pass']"``);
    ``ast.literal_eval`` evaluates literals only, never code.
    """
    if not isinstance(value, str):
        return value
    try:
        return json.loads(value)
    except ValueError:
        pass
    try:
        return ast.literal_eval(value)
    except (ValueError, TypeError, SyntaxError, RecursionError):
        return None


def _criterion_score(entry: Any) -> float | None:
    """A judgement criterion's score: ``{"score": 4, ...}`` or a bare number."""
    return _as_float(entry.get("score") if isinstance(entry, Mapping) else entry)


class OpenCodeInstructFilter(BaseModel):
    """Which OpenCodeInstruct rows a category keeps; set per category in its config.

    ``None`` / empty means "no constraint". Unknown fields are refused so a misspelt filter in a
    config fails loudly instead of silently keeping everything.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    domains: frozenset[str] | None = None
    generation_algorithms: frozenset[str] | None = None
    min_average_test_score: float | None = Field(default=None, ge=0.0, le=1.0)
    require_all_tests_pass: bool = False
    min_llm_judgement: dict[str, float] = Field(default_factory=dict)

    @field_validator("min_llm_judgement")
    @classmethod
    def _known_criteria(cls, value: dict[str, float]) -> dict[str, float]:
        """A misspelt criterion would be missing from every row and so filter out every row: refuse it."""
        unknown = sorted(set(value) - set(JUDGEMENT_CRITERIA))
        if unknown:
            guesses = [_closest_criterion(name) for name in unknown]
            hints = "".join(f" (did you mean {g!r}?)" for g in guesses if g)
            known = ", ".join(JUDGEMENT_CRITERIA)
            raise ValueError(f"unknown criterion {', '.join(map(repr, unknown))}{hints}; known: {known}")
        return value

    def steps(self) -> list[str]:
        """The configured checks, in the order ``reject_reason`` runs them, named by their column:
        every reason a check gives starts with that name, so rejects count per filter step."""
        configured = {
            "domain": self.domains is not None,
            "generation_algorithm": self.generation_algorithms is not None,
            "average_test_score": self.min_average_test_score is not None,
            "tests_execution_status": self.require_all_tests_pass,
            "llm_judgement": bool(self.min_llm_judgement),
        }
        return [name for name, active in configured.items() if active]

    def reject_reason(self, row: Row) -> str | None:
        """Why ``row`` is filtered out (the first failing check, in a fixed order), or None to keep it.

        Reasons start with the column they are about, so rejects can be grouped per filter.
        """
        checks: tuple[Callable[[Row], str | None], ...] = (
            self._check_domain,
            self._check_generation_algorithm,
            self._check_average_test_score,
            self._check_tests_pass,
            self._check_llm_judgement,
        )
        for check in checks:
            reason = check(row)
            if reason is not None:
                return reason
        return None

    def _check_domain(self, row: Row) -> str | None:
        return _allowed("domain", row.get("domain"), self.domains)

    def _check_generation_algorithm(self, row: Row) -> str | None:
        return _allowed("generation_algorithm", row.get("generation_algorithm"), self.generation_algorithms)

    def _check_average_test_score(self, row: Row) -> str | None:
        if self.min_average_test_score is None:
            return None
        score = _as_float(row.get("average_test_score"))
        if score is None:
            return "average_test_score is not a number"
        if score < self.min_average_test_score:
            return f"average_test_score below {self.min_average_test_score}"
        return None

    def _check_tests_pass(self, row: Row) -> str | None:
        if not self.require_all_tests_pass:
            return None
        statuses = _literal(row.get("tests_execution_status"))
        if not isinstance(statuses, list) or not all(isinstance(s, str) for s in statuses):
            return "tests_execution_status is not a list of strings"
        if not statuses:
            return "tests_execution_status has no test results"
        if any(status.strip().lower() != "pass" for status in statuses):
            return "tests_execution_status has failing tests"
        return None

    def _check_llm_judgement(self, row: Row) -> str | None:
        if not self.min_llm_judgement:
            return None
        judgement = _literal(row.get("llm_judgement"))
        if not isinstance(judgement, Mapping):
            return "llm_judgement is not an object"
        for criterion, minimum in sorted(self.min_llm_judgement.items()):
            score = _criterion_score(judgement.get(criterion))
            if score is None:
                return f"llm_judgement has no {criterion} score"
            if score < minimum:
                return f"llm_judgement {criterion} below {minimum}"
        return None


def _closest_criterion(name: str) -> str | None:
    """The criterion a typo meant: one that contains it (``edge_case``), else the closest spelling."""
    containing = [c for c in JUDGEMENT_CRITERIA if name and name in c]
    close = containing or difflib.get_close_matches(name, JUDGEMENT_CRITERIA, n=1)
    return close[0] if close else None


def _allowed(column: str, value: Any, allowed: frozenset[str] | None) -> str | None:
    if allowed is None or (isinstance(value, str) and value in allowed):
        return None
    return f"{column} {value!r} not allowed"


@register("opencodeinstruct")
def convert_opencodeinstruct(row: Row) -> Converted:
    """``input`` as the single user turn; the row's ``id`` is the record id."""
    prompt = row.get("input")
    if prompt is None:
        raise ConversionError("missing 'input' column")
    if not isinstance(prompt, str):
        raise ConversionError(f"'input' is a {type(prompt).__name__}, not a string")
    if not prompt.strip():
        raise ConversionError("empty input")
    source_id = row.get("id")
    return Converted(
        messages=[{"role": "user", "content": prompt.strip()}],
        tools=None,
        source_id=str(source_id) if source_id is not None else None,
    )
