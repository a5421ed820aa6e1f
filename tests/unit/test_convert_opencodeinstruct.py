"""nvidia/OpenCodeInstruct: the converter and the per-category row filter."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from prompts.convert_opencodeinstruct import OpenCodeInstructFilter, convert_opencodeinstruct
from prompts.errors import ConversionError
from prompts.formats import get_converter, to_record
from prompts.records import content_hash

FIXTURES = Path(__file__).parent.parent / "fixtures" / "prompts"
ROWS: dict[str, dict[str, Any]] = {
    row["id"]: row
    for row in map(json.loads, (FIXTURES / "opencodeinstruct.jsonl").read_text(encoding="utf-8").splitlines())
}
PALINDROME = "a3f1c2d4e5b60718293a4b5c6d7e8f90"  # generic, self-instruct, 1.0, judgement 5/5/5
WINDOW = "0b9c8d7e6f5a4b3c2d1e0f9a8b7c6d5e"  # algorithmic, evol-instruct, 1.0, 5/5/4
LRU = "f00dbabe11223344556677889900aabb"  # algorithmic, self-instruct, 0.67 (one fail), 5/4/3
VOYELLES = "5e6f7a8b9c0d1e2f3a4b5c6d7e8f9a0b"  # generic, evol-instruct, 1.0, 4/4/4, French
LOGS = "c0ffee00c0ffee00c0ffee00c0ffee00"  # generic, evol-instruct, 1.0, 4/5/4, very long prompt
DURATION = "deadbeefdeadbeefdeadbeefdeadbeef"  # generic, self-instruct, 0.8 (one fail), 3/3/2


def reasons(row_filter: OpenCodeInstructFilter) -> dict[str, str | None]:
    return {row_id: row_filter.reject_reason(row) for row_id, row in ROWS.items()}


def with_columns(**columns: Any) -> dict[str, Any]:
    return {**ROWS[PALINDROME], **columns}


# --- converter -----------------------------------------------------------------------------------


def test_fixture_rows_become_a_single_user_turn_with_the_row_id() -> None:
    converted = convert_opencodeinstruct(ROWS[PALINDROME])
    assert converted.messages == [
        {
            "role": "user",
            "content": "Write a Python function `is_palindrome(s)` that returns True if the string reads the "
            "same forwards and backwards, ignoring case and non-alphanumeric characters.",
        }
    ]
    assert converted.tools is None
    assert converted.source_id == PALINDROME


def test_unicode_prompt_is_kept_verbatim() -> None:
    assert convert_opencodeinstruct(ROWS[VOYELLES]).messages == [
        {
            "role": "user",
            "content": "Écrivez une fonction Python `compter_voyelles(texte)` qui compte les voyelles "
            "(y compris accentuées : é, è, à, ù, ï) dans une chaîne. "
            "Exemple : compter_voyelles('Ça été très drôle') → 6.",
        }
    ]


def test_very_long_prompt_is_not_truncated_only_trimmed() -> None:
    (message,) = convert_opencodeinstruct(ROWS[LOGS]).messages
    assert len(ROWS[LOGS]["input"]) == 9901
    assert message == {"role": "user", "content": ROWS[LOGS]["input"].removesuffix("\n")}
    assert message["content"].endswith("2024-05-01T12:59:00Z node-3 INFO step 59 done\n```")


def test_every_fixture_row_converts_with_its_own_id() -> None:
    assert {row_id: convert_opencodeinstruct(row).source_id for row_id, row in ROWS.items()} == {
        row_id: row_id for row_id in ROWS
    }


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        (None, "missing 'input' column"),
        ("", "empty input"),
        ("  \n", "empty input"),
        (42, "'input' is a int, not a string"),
    ],
)
def test_empty_input_is_rejected(value: Any, reason: str) -> None:
    with pytest.raises(ConversionError) as info:
        convert_opencodeinstruct(with_columns(input=value))
    assert info.value.reason == reason


def test_registered_and_the_record_id_is_the_row_id() -> None:
    assert get_converter("opencodeinstruct") is convert_opencodeinstruct
    record = to_record(
        ROWS[WINDOW],
        index=1,
        category="B2_opencodeinstruct",
        dataset="oci",
        split="train",
        fmt="opencodeinstruct",
    )
    assert record.id == WINDOW
    assert record.tools is None


def test_row_without_id_gets_the_content_hash() -> None:
    row = {"input": "Reverse a list."}
    record = to_record(row, index=0, category="c", dataset="d", split="train", fmt="opencodeinstruct")
    assert record.id == content_hash([{"role": "user", "content": "Reverse a list."}])


# --- filter on the fixture rows ------------------------------------------------------------------


def test_default_filter_keeps_everything() -> None:
    assert reasons(OpenCodeInstructFilter()) == dict.fromkeys(ROWS)


def test_min_average_test_score() -> None:
    assert reasons(OpenCodeInstructFilter(min_average_test_score=0.8)) == {
        **dict.fromkeys(ROWS),
        LRU: "average_test_score below 0.8",
    }


def test_require_all_tests_pass() -> None:
    assert reasons(OpenCodeInstructFilter(require_all_tests_pass=True)) == {
        **dict.fromkeys(ROWS),
        LRU: "tests_execution_status has failing tests",
        DURATION: "tests_execution_status has failing tests",
    }


def test_min_llm_judgement_reports_the_first_failing_criterion_alphabetically() -> None:
    row_filter = OpenCodeInstructFilter(
        min_llm_judgement={"logical_correctness": 4, "edge_case_consideration": 4}
    )
    assert reasons(row_filter) == {
        **dict.fromkeys(ROWS),
        LRU: "llm_judgement edge_case_consideration below 4.0",
        DURATION: "llm_judgement edge_case_consideration below 4.0",
    }
    row_filter = OpenCodeInstructFilter(min_llm_judgement={"requirement_conformance": 5})
    assert reasons(row_filter) == {
        **dict.fromkeys(ROWS),
        VOYELLES: "llm_judgement requirement_conformance below 5.0",
        LOGS: "llm_judgement requirement_conformance below 5.0",
        DURATION: "llm_judgement requirement_conformance below 5.0",
    }


def test_domain_and_generation_algorithm_allow_lists() -> None:
    assert reasons(OpenCodeInstructFilter(domains=frozenset({"algorithmic"}))) == {
        PALINDROME: "domain 'generic' not allowed",
        WINDOW: None,
        LRU: None,
        VOYELLES: "domain 'generic' not allowed",
        LOGS: "domain 'generic' not allowed",
        DURATION: "domain 'generic' not allowed",
    }
    assert reasons(OpenCodeInstructFilter(generation_algorithms=frozenset({"evol-instruct"}))) == {
        PALINDROME: "generation_algorithm 'self-instruct' not allowed",
        WINDOW: None,
        LRU: "generation_algorithm 'self-instruct' not allowed",
        VOYELLES: None,
        LOGS: None,
        DURATION: "generation_algorithm 'self-instruct' not allowed",
    }


def test_checks_run_in_a_fixed_order_and_report_the_first_failure() -> None:
    row_filter = OpenCodeInstructFilter(
        domains=frozenset({"generic", "algorithmic"}),
        generation_algorithms=frozenset({"self-instruct", "evol-instruct"}),
        min_average_test_score=0.9,
        require_all_tests_pass=True,
        min_llm_judgement={"logical_correctness": 5},
    )
    assert reasons(row_filter) == {
        PALINDROME: None,
        WINDOW: None,
        LRU: "average_test_score below 0.9",
        VOYELLES: "llm_judgement logical_correctness below 5.0",
        LOGS: None,
        DURATION: "average_test_score below 0.9",
    }
    strict_domain = row_filter.model_copy(update={"domains": frozenset({"web"})})
    assert strict_domain.reject_reason(ROWS[LRU]) == "domain 'algorithmic' not allowed"


# --- filter robustness on stringly-typed columns -------------------------------------------------


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        ("1.0", None),
        (" 0.95 ", None),
        (1, None),
        ("0.5", "average_test_score below 0.9"),
        ("n/a", "average_test_score is not a number"),
        ("", "average_test_score is not a number"),
        ("nan", "average_test_score is not a number"),
        (None, "average_test_score is not a number"),
        (True, "average_test_score is not a number"),
    ],
)
def test_average_test_score_parsing(value: Any, reason: str | None) -> None:
    row_filter = OpenCodeInstructFilter(min_average_test_score=0.9)
    assert row_filter.reject_reason(with_columns(average_test_score=value)) == reason


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        ('["pass", "pass"]', None),
        ("['pass', 'PASS']", None),
        (["pass"], None),
        ("['pass', 'fail']", "tests_execution_status has failing tests"),
        ("[]", "tests_execution_status has no test results"),
        ("pass", "tests_execution_status is not a list of strings"),
        ("['pass', 1]", "tests_execution_status is not a list of strings"),
        ("[__import__('os')]", "tests_execution_status is not a list of strings"),
        (None, "tests_execution_status is not a list of strings"),
    ],
)
def test_tests_execution_status_parsing(value: Any, reason: str | None) -> None:
    row_filter = OpenCodeInstructFilter(require_all_tests_pass=True)
    assert row_filter.reject_reason(with_columns(tests_execution_status=value)) == reason


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        ('{"logical_correctness": {"score": 4}}', None),
        ('{"logical_correctness": 5}', None),
        ('{"logical_correctness": {"score": "4.5"}}', None),
        ("{'logical_correctness': {'score': 4}}", None),
        ('{"logical_correctness": {"score": 3}}', "llm_judgement logical_correctness below 4.0"),
        ('{"style": {"score": 5}}', "llm_judgement has no logical_correctness score"),
        ('{"logical_correctness": {"score": "high"}}', "llm_judgement has no logical_correctness score"),
        (
            '{"logical_correctness": {"justification": "ok"}}',
            "llm_judgement has no logical_correctness score",
        ),
        ("[4]", "llm_judgement is not an object"),
        ("{not json", "llm_judgement is not an object"),
        (None, "llm_judgement is not an object"),
    ],
)
def test_llm_judgement_parsing(value: Any, reason: str | None) -> None:
    row_filter = OpenCodeInstructFilter(min_llm_judgement={"logical_correctness": 4})
    assert row_filter.reject_reason(with_columns(llm_judgement=value)) == reason


@pytest.mark.parametrize("value", [None, ["algorithmic"], 7])
def test_non_string_allow_list_values_are_rejected_not_crashed(value: Any) -> None:
    row_filter = OpenCodeInstructFilter(domains=frozenset({"algorithmic"}))
    assert row_filter.reject_reason(with_columns(domain=value)) == f"domain {value!r} not allowed"


# --- filter configuration ------------------------------------------------------------------------


def test_filter_loads_from_a_config_mapping() -> None:
    row_filter = OpenCodeInstructFilter.model_validate(
        {
            "domains": ["generic"],
            "min_average_test_score": "0.5",
            "min_llm_judgement": {"logical_correctness": "4"},
        }
    )
    assert row_filter.domains == frozenset({"generic"})
    assert row_filter.min_average_test_score == 0.5
    assert row_filter.min_llm_judgement == {"logical_correctness": 4.0}


@pytest.mark.parametrize(
    "config",
    [{"min_average_score": 0.5}, {"min_average_test_score": 1.5}, {"min_average_test_score": -0.1}],
)
def test_filter_refuses_typos_and_out_of_range_scores(config: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        OpenCodeInstructFilter.model_validate(config)


def test_a_misspelt_judgement_criterion_is_a_config_error_naming_the_right_one() -> None:
    with pytest.raises(
        ValidationError, match=r"unknown criterion 'edge_case' \(did you mean 'edge_case_consideration'\?\)"
    ):
        OpenCodeInstructFilter.model_validate({"min_llm_judgement": {"edge_case": 4}})
