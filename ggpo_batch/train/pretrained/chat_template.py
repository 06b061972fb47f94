"""What a checkpoint's chat template reads, and whether the prompt it renders leaves the model thinking.

Hybrid reasoning templates (Qwen3's) open a hidden reasoning block unless they are rendered with a
keyword (`enable_thinking=False`, which writes an empty `<think>\\n\\n</think>` after the generation
prompt); by default they show nothing of it in the prompt, and the model then spends its turn's
tokens thinking before any `<search>` or answer. `[train.model] chat_template_kwargs` passes
keywords to every rendering (`codec.HfCodec.chat_text`); `check` is what preflight refuses:

- a thinking switch (`THINKING_SWITCHES`) the template reads and the spec leaves at its default;
- a keyword the template never reads (Jinja ignores it silently);
- a rendered prompt that ends inside an open reasoning block (`REASONING_TAGS`).

The template's variables come from parsing its Jinja source (template_names.py), not from rendering
guesses. Imports jinja2 only when called (transformers needs it for chat templates anyway).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

# Template variables that switch a model's reasoning on or off, by the families whose templates read
# them: Qwen3, GLM-4.5, SmolLM3, Hunyuan (`enable_thinking`); DeepSeek-V3.1, Granite 3.2 (`thinking`);
# gpt-oss (`reasoning_effort`); Seed-OSS (`thinking_budget`). A template that reads one thinks or not
# by a default the rendered prompt does not show: the spec must choose.
# Each with the value that turns reasoning off (or down: gpt-oss always reasons a little).
THINKING_SWITCHES = {"enable_thinking": "false", "thinking": "false", "reasoning_effort": '"low"',
                     "thinking_budget": "0"}
# Switches that are yes/no: a TOML 0/1 would read as "defined and not false" in Qwen3's
# `enable_thinking is false` test and leave the model thinking.
BOOLEAN_SWITCHES = ("enable_thinking", "thinking")
# (open, close) of the reasoning blocks of common reasoning models: <think> (Qwen3, DeepSeek-R1, GLM,
# SmolLM3, Phi-4-reasoning), <thinking>, <reasoning>, <seed:think> (Seed-OSS), [THINK] (Magistral),
# <|START_THINKING|> (Command A Reasoning).
REASONING_TAGS = (("<think>", "</think>"), ("<thinking>", "</thinking>"), ("<reasoning>", "</reasoning>"),
                  ("<seed:think>", "</seed:think>"), ("[THINK]", "[/THINK]"),
                  ("<|START_THINKING|>", "<|END_THINKING|>"))
# Arguments of transformers' apply_chat_template itself: not template keywords (passing one twice
# is a TypeError, and `tokenize` would change what the call returns).
RESERVED_KEYWORDS = ("conversation", "messages", "tools", "documents", "chat_template", "add_generation_prompt",
                     "continue_final_message", "tokenize", "padding", "truncation", "max_length", "return_tensors",
                     "return_dict", "return_assistant_tokens_mask", "tokenizer_kwargs")
# What every template reads besides keywords: the conversation and transformers' globals.
CONVERSATION_VARIABLES = frozenset({"messages", "tools", "documents", "add_generation_prompt", "raise_exception",
                                    "strftime_now"})
FIELD = "train.model.chat_template_kwargs"


def template_variables(source: str) -> frozenset[str]:
    """The names `source` (a Jinja chat template) may read from its context: messages,
    add_generation_prompt, special tokens, and keywords such as enable_thinking (template_names.py)."""
    from .template_names import read_names

    return read_names(source)


def open_reasoning_tag(text: str) -> str | None:
    """The opening tag of a reasoning block `text` ends inside (opened, never closed after), or None."""
    for opening, closing in REASONING_TAGS:
        if text.rfind(opening) > text.rfind(closing):
            return opening
    return None


@dataclass(frozen=True)
class TemplateCheck:
    problems: list[str]  # one line each; empty when nothing is wrong
    renders: bool  # whether prompts can be rendered at all (else nothing can be measured with them)


def check(source: str, kwargs: Mapping[str, Any], render: Callable[[str], str]) -> TemplateCheck:
    """What is wrong with rendering prompts through the template `source` with `kwargs`;
    `render(question)` renders one prompt with them, the assistant turn opened, exactly as training
    does (`HfCodec.chat_text`)."""
    from .template_names import free_names

    try:
        read = template_variables(source)
    except Exception as exc:  # noqa: BLE001  (jinja2.TemplateSyntaxError and kin)
        return TemplateCheck([f"the chat template does not parse: {_first_line(exc)}"], False)
    found = []
    for switch, off in THINKING_SWITCHES.items():
        if switch in read and switch not in kwargs:
            found.append(f"the chat template has a thinking switch `{switch}` that the spec leaves at its default "
                         f"(a hybrid template thinks by default and shows nothing of it in the prompt): choose, e.g. "
                         f"chat_template_kwargs = {{ {switch} = {off} }} for the search protocol's short turns")
    for key in sorted(set(kwargs) - read):
        # Only the names a caller can pass: not those the template assigns itself (content, role, ...).
        others = sorted(free_names(source) - CONVERSATION_VARIABLES)
        found.append(f"`{key}` is never read by the chat template (the keywords it reads: "
                     f"{', '.join(others) or 'none'}); remove it")
    try:
        text = render("Where was the founder of Kazo born?")
    except Exception as exc:  # noqa: BLE001  (the template's raise_exception, a bad keyword value)
        failed = f"the chat template does not render with {dict(kwargs)}: {type(exc).__name__}: {_first_line(exc)}"
        return TemplateCheck([*found, failed], False)
    tag = open_reasoning_tag(text)
    if tag is not None:
        switches = [s for s in THINKING_SWITCHES if s in read]
        hint = (f"turn it off with chat_template_kwargs ({', '.join(switches)})" if switches else
                "the template has no switch: use the checkpoint's non-thinking (instruct) variant")
        found.append(f"the rendered prompt ends inside an open {tag} reasoning block (the model would think before "
                     f"every turn); {hint}")
    return TemplateCheck(found, True)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return (text.splitlines()[0] if text else type(exc).__name__)[:300]


def validate_kwargs(kwargs: Any, path: str) -> dict[str, bool | int | float | str]:
    """`chat_template_kwargs` of a spec as a dict of keyword -> bool/int/float/str, or SpecError."""
    from ...errors import SpecError

    if not isinstance(kwargs, Mapping):
        raise SpecError(path, FIELD, f"must be a table of keyword = value, e.g. {{ enable_thinking = false }}, "
                        f"got {kwargs!r}")
    out: dict[str, bool | int | float | str] = {}
    for key, value in kwargs.items():
        where = f"{FIELD}.{key}"
        if not isinstance(key, str) or not key.isidentifier():
            raise SpecError(path, where, "a template keyword must be a name (letters, digits, _)")
        if key in RESERVED_KEYWORDS:
            raise SpecError(path, where, "is an argument of apply_chat_template itself, not a template keyword")
        if not isinstance(value, (bool, int, float, str)):
            raise SpecError(path, where, f"must be true/false, a number or a string, got {value!r}")
        if key in BOOLEAN_SWITCHES and not isinstance(value, bool):
            raise SpecError(path, where, f"must be true or false, got {value!r} (templates test it with "
                            f"`is false`: {value!r} would leave the model thinking)")
        out[key] = value
    return out
