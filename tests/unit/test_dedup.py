"""The prompt dedup key: what counts as the same question, in each key version."""

from __future__ import annotations

import pytest

from prompts.dedup import prompt_key

PROGRAM = "Fix this:\nif x:\n    a()\nb()"


def _key(text: str) -> str:
    return prompt_key([{"role": "user", "content": text}])


def test_two_programs_that_differ_in_indentation_or_line_breaks_are_two_prompts() -> None:
    """Every whitespace run became one space: these are different Python programs, and the second
    was dropped as a duplicate of the first (a lost row in OpenCodeInstruct-style sets)."""
    assert _key(PROGRAM) != _key("Fix this:\nif x:\n    a()\n    b()")  # b() inside the if
    assert _key(PROGRAM) != _key("Fix this:\nif x:\n\ta()\nb()")  # a tab is not four spaces
    assert _key("Fix this:\nif x:\n    a()\n    b()") != _key("Fix this:\nif x:\n    a() b()")
    assert _key("Fix this:\na()\nb()") != _key("Fix this: a() b()")


@pytest.mark.parametrize(
    "same",
    [
        "Fix this:  \nif x:\t\n    a()   \nb()",  # trailing spaces and tabs
        "Fix this:\r\nif x:\r\n    a()\r\nb()\r\n",  # CRLF
        "Fix this:\rif x:\r    a()\rb()",  # old Mac line endings
        "\n  \nFix this:\nif x:\n    a()\nb()\n\n \n",  # blank lines around the text
        "Fix   this:\nif  x:\n    a()\nb()",  # space runs inside a line
        "Fix\tthis:\nif x:\n    a()\nb()",  # a tab inside a line
        "Fix this:\nif\u00a0x:\n    a()\nb()",  # a no-break space inside a line
    ],
)
def test_spacing_that_does_not_change_the_question_keeps_the_key(same: str) -> None:
    assert _key(same) == _key(PROGRAM)


def test_characters_are_joined_only_where_they_are_one_character() -> None:
    """NFKC folded ``x²`` into ``x2``: different questions in a math set, the second dropped."""
    assert _key("Solve x² = 4") != _key("Solve x2 = 4")
    assert _key("Add ½ and ¼") != _key("Add 1⁄2 and 1⁄4")
    assert _key("Ｆｉｘ") != _key("Fix")  # fullwidth letters are other tokens for the model
    assert _key("Explain caf\u00e9") == _key("Explain cafe\u0301")  # é, and e with a combining accent


def test_a_margin_shared_by_every_line_is_not_part_of_the_question() -> None:
    """A block pasted with a margin is the same block; an indentation of one line against the others is
    the program's structure."""
    assert _key("    if x:\n        a()\n    b()") == _key("if x:\n    a()\nb()")
    assert _key("  What is X?  ") == _key("What is X?")
    assert _key("    a()\nb()") != _key("a()\nb()")


def test_blank_lines_inside_the_text_are_kept() -> None:
    assert _key("a = '''\n\n'''") != _key("a = '''\n'''")
    assert _key("first\n\n\nsecond") != _key("first\nsecond")


def test_the_first_key_version_is_the_one_runs_made_before_versions_stored() -> None:
    """Resuming such a run compares new keys with its rows' ``prompt_hash``: the version 1 key must be
    what the code of then computed (these values were computed with it)."""
    assert prompt_key([{"role": "user", "content": PROGRAM}], version=1) == "3635da70be8fa06bef7026957d2b71b8"
    messages = [
        {"role": "system", "content": " Be  brief.\t"},
        {"role": "user", "content": "Ｆｉｘ this:\r\n  if x:  a()"},
    ]
    tools = [{"function": {"name": "f"}}]
    assert prompt_key(messages, tools, version=1) == "2837126e732a75eb7d1a7329f460252b"
    assert prompt_key([{"role": "user", "content": "Fix this:\nif x:\n    a()\n    b()"}], version=1) == (
        prompt_key([{"role": "user", "content": PROGRAM}], version=1)
    )


def test_an_unknown_key_version_is_refused() -> None:
    with pytest.raises(ValueError, match="prompt key version 99"):
        prompt_key([{"role": "user", "content": "hi"}], version=99)
