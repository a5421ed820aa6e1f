"""A deterministic stand-in for the model: prompt token counts, and each answer's shape and text.

There is no tokenizer here: prompt tokens are estimated (about 4 characters per token plus a few
per message for the chat template), and every generated "token" is one word piece. The answer is
a pure function of the simulator seed and the request, so a retried request gets the same answer
and tests can assert exact lengths. Its shape (reasoning, content or a tool call, finish reason)
is planned up front because the scheduler needs the final length; the text is produced lazily,
token by token, as the scheduler releases tokens.
"""

from __future__ import annotations

import hashlib
import json
import math
import random
import uuid
from dataclasses import dataclass
from typing import Any

from sglang_launch.simulator.config import SimConfig

CHARS_PER_TOKEN = 4
TOKENS_PER_MESSAGE = 4  # <|im_start|>role\n ... <|im_end|>\n
GENERATION_PROMPT_TOKENS = 3  # <|im_start|>assistant\n
TOOLS_PREAMBLE_TOKENS = 10  # the template's "# Tools ... <tools></tools>" frame
EOS_TOKEN_ID = 151645  # reported as matched_stop when an answer stops (Qwen's <|im_end|>)
THINK_END = "\n</think>\n\n"  # what a reasoning model emits between thinking and answer

VOCAB: tuple[str, ...] = (
    " the",
    " a",
    " of",
    " to",
    " and",
    " in",
    " is",
    " that",
    " for",
    " it",
    " with",
    " as",
    " on",
    " this",
    " be",
    " are",
    " by",
    " we",
    " can",
    " from",
    " value",
    " data",
    " model",
    " function",
    " return",
    " list",
    " string",
    " number",
    " result",
    " request",
    " server",
    " token",
    " cache",
    " memory",
    " batch",
    " queue",
    " step",
    " first",
    " next",
    " then",
    " because",
    " so",
    " if",
    " else",
    " each",
    " all",
    " new",
    " time",
    " user",
    " file",
    " line",
    " code",
    " test",
    " error",
    " input",
    " output",
    " state",
    " key",
    " index",
    " size",
    " type",
    " name",
    " path",
    " call",
    "ing",
    "ed",
    "er",
    "s",
    "ly",
    "tion",
    "ment",
    "able",
    "ize",
    "al",
    "ive",
    "ous",
    "ness",
    ".",
    ",",
    ":",
    ";",
    "(",
    ")",
    "[",
    "]",
    "{",
    "}",
    " =",
    " +",
    " -",
    " *",
    " /",
    " <",
    " >",
    "\n",
    "\n\n",
    "    ",
    " `",
    "_",
    "0",
    "1",
    "2",
    "3",
    "x",
    "y",
    "i",
    "n",
    " def",
    " class",
    " import",
    " None",
    " True",
    " False",
    " self",
    " print",
    " len",
    " range",
    " Let",
    " We",
    " First",
    " So",
    " Now",
    " Wait",
    " Hmm",
    " check",
    " think",
    " consider",
    " answer",
    " question",
)

WORDS: tuple[str, ...] = tuple(w for w in (piece.strip() for piece in VOCAB) if w.isalpha() and w.islower())


def text_tokens(text: str) -> int:
    """Estimated token count of a piece of text (at least one for any non-empty text)."""
    return math.ceil(len(text) / CHARS_PER_TOKEN)


def _content_text(content: Any) -> str:
    """Message content as text: plain strings, or the text parts of a multi-part content list."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return ""


def estimate_prompt_tokens(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> int:
    """Prompt tokens after the chat template, estimated without a tokenizer."""
    total = GENERATION_PROMPT_TOKENS
    for message in messages:
        total += TOKENS_PER_MESSAGE + text_tokens(_content_text(message.get("content")))
        if message.get("tool_calls"):
            total += text_tokens(json.dumps(message["tool_calls"], ensure_ascii=False))
    if tools:
        total += TOOLS_PREAMBLE_TOKENS + text_tokens(json.dumps(tools, ensure_ascii=False))
    return total


@dataclass(frozen=True, slots=True)
class AnswerSettings:
    """The model's behaviour knobs (from SimConfig)."""

    stop_probability: float = 0.1
    stop_length_mean: float | None = None
    reasoning: bool = False
    reasoning_fraction: float = 0.5
    tool_calls: bool = False
    tool_call_probability: float = 0.5
    seed: int = 0

    @classmethod
    def from_config(cls, cfg: SimConfig) -> AnswerSettings:
        """Pick the answer knobs out of the full simulator configuration."""
        return cls(**{name: getattr(cfg, name) for name in cls.__dataclass_fields__})


@dataclass(frozen=True, slots=True)
class AnswerRequest:
    """The parts of a chat request that decide the answer."""

    messages: list[dict[str, Any]]
    max_new_tokens: int
    tools: list[dict[str, Any]] | None = None
    tool_choice: Any = None
    thinking: bool = True
    separate_reasoning: bool = True
    ignore_eos: bool = False


@dataclass(frozen=True, slots=True)
class ToolCallPlan:
    """A tool call the answer will make; ``tokens`` is the length of its generated text."""

    id: str
    name: str
    arguments: str
    tokens: int


@dataclass(frozen=True, slots=True)
class AnswerPlan:
    """The answer's shape: how many tokens of reasoning, of content, and the tool call if any."""

    reasoning_tokens: int
    content_tokens: int
    tool_call: ToolCallPlan | None
    finish_reason: str
    separate_reasoning: bool
    text_seed: int

    @property
    def output_tokens(self) -> int:
        """Total completion tokens, what the scheduler must generate."""
        return self.reasoning_tokens + self.content_tokens + (self.tool_call.tokens if self.tool_call else 0)

    @property
    def matched_stop(self) -> int | None:
        """SGLang reports the EOS id that ended the answer, and null when max_tokens did."""
        return None if self.finish_reason == "length" else EOS_TOKEN_ID

    @property
    def reported_reasoning_tokens(self) -> int:
        """``usage.reasoning_tokens``: only counted when the reasoning parser separated it."""
        return self.reasoning_tokens if self.separate_reasoning else 0


def _request_seed(settings: AnswerSettings, req: AnswerRequest) -> int:
    canonical = json.dumps(
        [settings.seed, req.messages, req.tools, req.tool_choice, req.max_new_tokens, req.thinking],
        sort_keys=True,
        ensure_ascii=False,
        default=str,
    )
    return int.from_bytes(hashlib.sha256(canonical.encode("utf-8")).digest()[:8], "big")


def _function_of(tool: Any) -> dict[str, Any] | None:
    """The ``function`` object of an OpenAI tool schema, or None for a malformed one."""
    function = tool.get("function") if isinstance(tool, dict) else None
    if isinstance(function, dict) and isinstance(function.get("name"), str) and function["name"]:
        return function
    return None


def _choose_tool(req: AnswerRequest, settings: AnswerSettings, rng: random.Random) -> dict[str, Any] | None:
    """Which function to call, following ``tool_choice`` ("none", "auto", "required", named)."""
    functions = [f for f in map(_function_of, req.tools or []) if f is not None]
    draw = rng.random()
    if not settings.tool_calls or not functions or req.tool_choice == "none":
        return None
    if isinstance(req.tool_choice, dict):
        wanted = (req.tool_choice.get("function") or {}).get("name")
        return next((f for f in functions if f["name"] == wanted), None)
    if req.tool_choice != "required" and draw >= settings.tool_call_probability:
        return None
    return functions[rng.randrange(len(functions))]


def sample_value(schema: Any, rng: random.Random, depth: int = 0) -> Any:
    """A value matching a JSON schema fragment: enough for arguments that parse and look right."""
    if not isinstance(schema, dict):
        return rng.choice(WORDS)
    if isinstance(schema.get("enum"), list) and schema["enum"]:
        return rng.choice(schema["enum"])
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    if kind == "integer":
        return rng.randint(0, 100)
    if kind == "number":
        return round(rng.uniform(0, 100), 2)
    if kind == "boolean":
        return rng.random() < 0.5
    if kind == "null":
        return None
    if kind == "array":
        return (
            [sample_value(schema.get("items"), rng, depth + 1) for _ in range(rng.randint(1, 2))]
            if depth < 4
            else []
        )
    if kind == "object" or "properties" in schema:
        properties = schema.get("properties")
        if not isinstance(properties, dict) or depth >= 4:
            return {}
        return {name: sample_value(sub, rng, depth + 1) for name, sub in properties.items()}
    return rng.choice(WORDS)


def _plan_tool_call(function: dict[str, Any], rng: random.Random) -> ToolCallPlan:
    parameters = function.get("parameters")
    arguments = sample_value(parameters if isinstance(parameters, dict) else {"type": "object"}, rng)
    arguments_json = json.dumps(arguments if isinstance(arguments, dict) else {}, ensure_ascii=False)
    name = function["name"]
    raw = f'<tool_call>\n{{"name": "{name}", "arguments": {arguments_json}}}\n</tool_call>'
    call_id = "call_" + uuid.UUID(int=rng.getrandbits(128)).hex[:24]
    return ToolCallPlan(id=call_id, name=name, arguments=arguments_json, tokens=max(2, text_tokens(raw)))


def plan_answer(req: AnswerRequest, settings: AnswerSettings) -> AnswerPlan:
    """Decide the answer's shape deterministically from the seed and the request.

    A tool call (when tools are offered and the knob is on) follows an optional reasoning part and
    ends with ``tool_calls``; it is dropped if it would not fit ``max_new_tokens``. Otherwise the
    answer stops early (EOS) with ``stop_probability`` unless ``ignore_eos``, else runs to
    ``max_new_tokens`` and ends with ``length``; reasoning takes ``reasoning_fraction`` of it. An
    early stop is at a uniform point, or at an exponential length of ``stop_length_mean`` (one
    past ``max_new_tokens`` runs to it).
    """
    seed = _request_seed(settings, req)
    rng = random.Random(seed)
    max_new = req.max_new_tokens
    thinking = settings.reasoning and req.thinking
    function = _choose_tool(req, settings, rng)
    stop_draw = rng.random()
    if settings.stop_length_mean is None:
        stop_at = rng.randint(1, max(1, max_new - 1))
    else:
        stop_at = 1 + int(rng.expovariate(1.0 / settings.stop_length_mean))
    reasoning_budget = int(max_new * settings.reasoning_fraction) if thinking else 0
    if function is not None:
        tool = _plan_tool_call(function, rng)
        reasoning = rng.randint(min(1, reasoning_budget), reasoning_budget)
        if reasoning + tool.tokens <= max_new:
            return AnswerPlan(reasoning, 0, tool, "tool_calls", req.separate_reasoning, seed + 1)
    if not req.ignore_eos and max_new > stop_at and stop_draw < settings.stop_probability:
        output, finish = stop_at, "stop"
    else:
        output, finish = max_new, "length"
    reasoning = int(output * settings.reasoning_fraction) if thinking else 0
    return AnswerPlan(reasoning, output - reasoning, None, finish, req.separate_reasoning, seed + 1)


@dataclass(frozen=True, slots=True)
class AnswerDelta:
    """The text of a run of consecutive tokens, split the way SGLang's parsers split it."""

    reasoning: str = ""
    content: str = ""
    tool_started: bool = False
    tool_arguments: str = ""


class AnswerCursor:
    """Walks an answer token by token and renders the text of each run of tokens.

    Reasoning comes first (into ``reasoning_content``, or inline in ``content`` closed by
    ``</think>`` when not separated), then content or the tool call: its first token opens the
    call (id and name), its other tokens carry the arguments in even slices.
    """

    def __init__(self, plan: AnswerPlan) -> None:
        self._plan = plan
        self._rng = random.Random(plan.text_seed)
        self._pos = 0

    @property
    def position(self) -> int:
        """Tokens rendered so far."""
        return self._pos

    def advance(self, n: int) -> AnswerDelta:
        """Render the next ``n`` tokens (fewer if the answer ends first)."""
        plan = self._plan
        start, end = self._pos, min(self._pos + n, plan.output_tokens)
        self._pos = end
        r_end = plan.reasoning_tokens
        c_end = r_end + plan.content_tokens
        reasoning = self._words(max(0, min(end, r_end) - start))
        content = self._words(max(0, min(end, c_end) - max(start, r_end)))
        if not plan.separate_reasoning:
            closes_thinking = plan.reasoning_tokens > 0 and start <= r_end < end
            reasoning, content = "", reasoning + (THINK_END if closes_thinking else "") + content
        tool = plan.tool_call
        if tool is None or end <= c_end:
            return AnswerDelta(reasoning=reasoning, content=content)
        first, last = max(start, c_end) - c_end, end - c_end
        return AnswerDelta(
            reasoning=reasoning,
            content=content,
            tool_started=first == 0,
            tool_arguments=self._argument_slice(tool, max(first, 1) - 1, last - 1),
        )

    def _words(self, count: int) -> str:
        return "".join(self._rng.choice(VOCAB) for _ in range(count))

    @staticmethod
    def _argument_slice(tool: ToolCallPlan, lo: int, hi: int) -> str:
        """Argument characters carried by argument tokens ``[lo, hi)`` of ``tokens - 1``."""
        slots, length = tool.tokens - 1, len(tool.arguments)
        return tool.arguments[lo * length // slots : hi * length // slots]
