"""What preflight checks in a pretrained checkpoint folder (`check`); the chat format's end of turn is
the codec's (`codec.end_of_turn_id`).

The folder is read as untrusted files first (checkpoint_files.py); then its config (a causal LM),
safetensors weights, tokenizer (loads, a chat template, an EOS), the vocabulary against the
embeddings, the positions against max_model_len, and the chat template (train/chat_template.py: its
thinking switch, its keywords, an open reasoning block; here: a prompt that depends on the date).
Every problem goes to the report under its spec field, one line each. Families differ in each of
these (docs/researcher.md has the table).
"""

from __future__ import annotations

import datetime
import hashlib
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from ..config import TrainConfig


class Report(Protocol):
    """Where the checks put what they find (the preflight's Report is one): the payload does not
    import the spec's checks that call it."""

    facts: dict[str, Any]

    def add(self, field_: str, message: str, *, absent: bool = False) -> None: ...

WHERE = "train.model.path"
# transformers' int(1e30): the model_max_length save_pretrained writes when none was set
# (tokenization_utils_base.VERY_LARGE_INTEGER); transformers reads any value this large as unset.
UNSET_MAX_LENGTH = int(1e30)
# Two days a template that reads the clock renders differently (any two differing dates would do).
DATES = (datetime.datetime(2024, 7, 26, 12, 0), datetime.datetime(2025, 1, 1, 12, 0))
# The question of the one fixed rendering provenance records (and the render checks use).
FIXED_QUESTION = "Where was the founder of Kazo born?"


def vocab_problem(tokenizer: Any, vocab: int, rendered: list[int]) -> str | None:
    """A token the run can feed that lies outside the `vocab` embeddings: one of the base vocabulary,
    of the chat template's `rendered` tokens, or an added token that is not special (data are encoded
    with special tokens split, and sampling never produces an id >= vocab). A larger tokenizer is otherwise fine
    (gemma-3-1b-it: `<image_soft_token>` at id 262144, one past its 262144 embeddings)."""
    base = int(getattr(tokenizer, "vocab_size", 0) or 0)  # the vocabulary without added tokens: data's tokens
    if base > vocab:
        return f"the tokenizer's vocabulary has {base} tokens (data are encoded into any of them), the model's embeddings {vocab}"
    over = sorted({i for i in rendered if i >= vocab})
    if over:
        return (f"the chat template's rendering holds token {over[0]} ({tokenizer.convert_ids_to_tokens(over[0])!r}), "
                f"beyond the model's {vocab} embeddings")
    plain = sorted(i for i, t in (getattr(tokenizer, "added_tokens_decoder", {}) or {}).items()
                   if i >= vocab and not getattr(t, "special", False))
    if plain:
        return (f"added token {plain[0]} ({tokenizer.convert_ids_to_tokens(plain[0])!r}) is not special, so text "
                f"can be encoded to it, and lies beyond the model's {vocab} embeddings")
    return None


def dated_problem(render: Any, kwargs: Mapping[str, Any], free: frozenset[str]) -> str | None:
    """Whether the template's prompt depends on the day it is rendered: rendered with its
    `strftime_now` bound to two fixed dates (never by touching the clock). `render(**extra)` renders
    the fixed prompt with the spec's keywords and `extra`."""
    texts = [render(strftime_now=lambda fmt, d=d: d.strftime(fmt)) for d in DATES]
    if texts[0] == texts[1]:
        return None
    pin = ('pin it with chat_template_kwargs = { date_string = "26 Jul 2024" }' if "date_string" in free and
           "date_string" not in kwargs else "pin the date with the keyword the template reads for it")
    return ("the chat template writes today's date into every prompt (strftime_now): runs started on different days "
            f"would train and evaluate on different text, and nothing would record it; {pin}")


def template_facts(source: str, kwargs: Mapping[str, Any], rendering: str) -> dict[str, Any]:
    """The provenance of the prompts: the template source's sha256, the keywords it is rendered with
    and its rendering of the fixed question."""
    return {"sha256": hashlib.sha256(source.encode("utf-8")).hexdigest(), "kwargs": dict(kwargs),
            "rendering": rendering}


def prompt_provenance(codec: Any) -> dict[str, Any]:
    """What a run's prompts were made with (an HfCodec's): the chat template's facts (`template_facts`)
    and the token that ends an answer."""
    tokenizer = codec.tokenizer
    return {"chat_template": template_facts(tokenizer.get_chat_template(), codec.chat_template_kwargs,
                                            codec.chat_text(codec.user_message(FIXED_QUESTION))),
            "end_of_turn": tokenizer.convert_ids_to_tokens(codec.eos_id)}


def max_length(tokenizer: Any) -> int | None:
    """The tokenizer's model_max_length, or None where it is unset (1e30 or more, as transformers reads it)."""
    value = getattr(tokenizer, "model_max_length", None)
    return int(value) if isinstance(value, int) and 0 < value < UNSET_MAX_LENGTH else None


def check(cfg: TrainConfig, report: Report) -> dict[str, Any] | None:
    """The checkpoint's figures and codec, every problem added to `report`; None when it cannot be used."""
    from ..pretrained import chat_template, hf
    from ..pretrained.template_names import free_names
    from .codec import HfCodec

    assert cfg.model is not None
    try:
        folder = hf.resolve(cfg.model.path)
    except hf.CheckpointError as exc:
        report.add(WHERE, exc.message, absent=exc.absent)
        return None
    untrusted = hf.check_folder(folder)  # before any library reads it (links out, FIFOs, bad JSON, headers)
    for problem in untrusted:
        report.add(WHERE, problem)
    if untrusted:
        return None
    try:
        config = hf.load_config(folder)
    except Exception as exc:  # noqa: BLE001  (transformers raises OSError, ValueError, KeyError...)
        report.add(WHERE, f"{folder}: the config does not load: {_first_line(exc)}")
        return None
    ok = True
    if not hf.is_causal_lm(config):
        report.add(WHERE, f"{folder}: model_type {getattr(config, 'model_type', None)!r} is not a causal LM that "
                   f"AutoModelForCausalLM loads")
        ok = False
    try:
        files = hf.weight_files(folder)
        eos = hf.eos_ids(folder)
    except hf.CheckpointError as exc:  # changed since it was checked
        report.add(WHERE, exc.message)
        return None
    missing = [f.name for f in files if not f.is_file()]
    if not files or missing:
        report.add(WHERE, f"{folder}: no safetensors weights" + (f" ({', '.join(missing[:3])} absent)" if missing else ""))
        ok = False
    try:
        tokenizer = hf.load_tokenizer(folder)
    except Exception as exc:  # noqa: BLE001
        report.add(WHERE, f"{folder}: the tokenizer does not load: {_first_line(exc)}")
        return None
    if not getattr(tokenizer, "chat_template", None):
        report.add(WHERE, f"{folder}: the tokenizer has no chat template (prompts are built with it; looked for in "
                   f"tokenizer_config.json, chat_template.jinja and {hf.CHAT_TEMPLATE_JSON})")
        ok = False
    if tokenizer.eos_token_id is None and not eos:
        report.add(WHERE, f"{folder}: neither the tokenizer, generation_config.json nor config.json names an EOS token")
        ok = False
    positions = getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", None)
    if positions and cfg.model.max_model_len > positions:
        report.add("train.model.max_model_len", f"{cfg.model.max_model_len} is more than the model's "
                   f"{positions} positions (max_position_embeddings)")
    if not ok:
        return None
    kwargs = cfg.model.chat_template_kwargs
    from ..pretrained.template_sandbox import Bounded

    def make_codec() -> HfCodec:  # renders the template (the end of turn): only after the guard below
        return HfCodec(tokenizer, max_model_len=cfg.model.max_model_len, eos_ids=eos, chat_template_kwargs=kwargs)

    # A template is code (train/template_sandbox.py): the first renderings, the codec's own included, run
    # in a child bounded in time and output; once one has ended there, the renders below end too.
    guard = Bounded(lambda q: make_codec().chat_text(q))
    try:
        guard(FIXED_QUESTION)
    except Exception:  # noqa: BLE001  (the template's own errors are chat_template.check's to report)
        if guard.runaway is not None:
            report.add(WHERE, f"{folder}: {guard.runaway}")
            return None
    codec = make_codec()
    source = tokenizer.get_chat_template()
    # The template's thinking switch, its keywords, and the prompt it renders (train/chat_template.py).
    render = Bounded(lambda q: codec.chat_text(codec.user_message(q)))
    template = chat_template.check(source, kwargs, render)
    if render.runaway is not None:
        report.add(WHERE, f"{folder}: {render.runaway}")
        return None
    for problem in template.problems:
        report.add(chat_template.FIELD, f"{folder}: {problem}")
    if not template.renders:
        return None
    message = [{"role": "user", "content": codec.user_message(FIXED_QUESTION)}]
    rendering = codec.chat_text(codec.user_message(FIXED_QUESTION))
    dated = dated_problem(lambda **extra: tokenizer.apply_chat_template(
        message, tokenize=False, add_generation_prompt=True, **{**kwargs, **extra}), kwargs, free_names(source))
    if dated:
        report.add(chat_template.FIELD, f"{folder}: {dated}")
    text = getattr(config, "text_config", None) or config
    vocab = int(getattr(config, "vocab_size", 0) or getattr(text, "vocab_size", 0) or 0)
    rendered = tokenizer(rendering, add_special_tokens=False)["input_ids"] + [codec.eos_id]
    overhang = vocab_problem(tokenizer, vocab, rendered) if vocab else None
    if overhang:
        report.add(WHERE, f"{folder}: {overhang}")
        return None
    try:
        params = hf.safetensors_parameters(files)
    except hf.CheckpointError as exc:
        report.add(WHERE, exc.message)
        return None
    report.facts.update(model_dir=str(folder), parameters=params, model_type=config.model_type,
                        **prompt_provenance(codec))
    if max_length(tokenizer) is not None:
        report.facts["tokenizer_model_max_length"] = max_length(tokenizer)
    return {"codec": codec, "parameters": params,
            "hidden": int(getattr(text, "hidden_size", 0) or getattr(text, "n_embd", 0)),
            "layers": int(getattr(text, "num_hidden_layers", 0) or getattr(text, "n_layer", 0)),
            "vocab": vocab or len(tokenizer), "dtype_bytes": hf.DTYPE_BYTES[cfg.model.dtype]}


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return (text.splitlines()[0] if text else type(exc).__name__)[:300]
