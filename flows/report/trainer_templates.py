"""The default system prompts of SpecForge's chat templates, to check an export against the trainer.

Why this exists: the answers were generated from the prompt the *server* rendered with the target's
chat template, but SpecForge renders the exported conversation again, and its ``GeneralParser``
(also used by the thinking parser) puts the template's ``system_prompt`` first whenever a
conversation has no system turn. A row generated without a system prompt is then trained on a
context the target never saw. ``datagen export --trainer-template NAME`` compares the rows with
the template and says so; the fix is a category ``system_prompt`` equal to the template's default
(so the target sees it too), or a template without a default.

The table holds facts read from sgl-project/SpecForge ``specforge/data/template.py`` (the
``system_prompt`` of each registered template), as of commit 031c0d6b72a4b50a322eae151264a030e9db01bb,
which registers ling-3.0, ling-3.0-thinking, deepseek-v4 and glm-5.3 with ``system_prompt=None``;
templates not listed are unknown and not checked.
"""

from __future__ import annotations

from dataclasses import dataclass

_HELPFUL = "You are a helpful assistant."
_LLAMA3 = (
    "You are a helpful, respectful and honest assistant. Always answer as helpfully as possible, while "
    "being safe.  Your answers should not include any harmful, unethical, racist, sexist, toxic, "
    "dangerous, or illegal content. Please ensure that your responses are socially unbiased and positive "
    "in nature.\n\nIf a question does not make any sense, or is not factually coherent, explain why "
    "instead of answering something not correct. If you don't know the answer to a question, please "
    "don't share false information."
)

SPECFORGE_DEFAULT_SYSTEM: dict[str, str] = {
    **dict.fromkeys(
        (
            "custom",
            "deepseek-v3",
            "gemma",
            "kimi-k2-instruct",
            "kimi-k2-thinking",
            "ling-flash-2.0",
            "llama4",
            "longcat",
            "longcat_xml",
            "phi3",
            "phi4",
            "phi4-mini",
            "qwen",
            "qwen3-instruct",
            "qwen3-next-thinking",
            "qwen3-thinking",
        ),
        _HELPFUL,
    ),
    "llama3": _LLAMA3,
    **dict.fromkeys(
        (
            "deepseek-r1-distill",
            "deepseek-v2",
            "deepseek-v32",
            "deepseek-v4",
            "glm-5.2",
            "glm-5.3",
            "gpt-oss",
            "gpt-oss-naive",
            "inkling-thinking",
            "kimi-k3-thinking",
            "lfm",
            "ling-3.0",
            "ling-3.0-thinking",
            "qwen3.5",
        ),
        "",
    ),
}
"""SpecForge template name -> the system prompt it inserts into a conversation without one ("" none)."""


@dataclass(frozen=True)
class SystemPromptCheck:
    """Rows of an export by whether they carry a system turn, per category."""

    without_system: dict[str, int]
    rows: int


def template_warning(template: str, check: SystemPromptCheck) -> str | None:
    """One line when the trainer template would give rows a system prompt the target never saw."""
    missing = sum(check.without_system.values())
    if template not in SPECFORGE_DEFAULT_SYSTEM:
        known = ", ".join(sorted(SPECFORGE_DEFAULT_SYSTEM))
        return f"Warning: unknown SpecForge template {template!r}, not checked (known: {known})"
    default = SPECFORGE_DEFAULT_SYSTEM[template]
    if not missing or not default:
        return None
    where = ", ".join(f"{name} {n}" for name, n in sorted(check.without_system.items()) if n)
    shown = default if len(default) <= 60 else default[:60] + "..."
    return (
        f"Warning: {missing} of {check.rows} rows ({where}) were generated without a system prompt, but "
        f"SpecForge's {template!r} template adds {shown!r} to them: the drafter would train on a "
        "context the target never saw. Regenerate those categories with system_prompt set to that "
        "text, or train with a template without a default system prompt."
    )


def unchecked_hint(check: SystemPromptCheck) -> str | None:
    """Without a template to compare with, a hint when some rows have no system turn."""
    missing = sum(check.without_system.values())
    if not missing:
        return None
    return (
        f"{missing} of {check.rows} rows have no system prompt; SpecForge templates such as qwen3-thinking "
        "add one in training: pass --trainer-template NAME to check against yours"
    )
