"""Preflight's check that every prompt a run can draw, plus a whole episode, fits max_model_len
(the prompts measured with the model's own chat template and tokenizer)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..contracts.runspec import ArmSpec
    from ..train.config import TrainConfig
    from ..train.task.codec import Codec
    from ..train.task.qa import Item


def prompts_fit(cfg: TrainConfig, arms: list[ArmSpec], data: Any, codec: Codec, report: Any,
                memo: dict[Any, Any], model_key: Any) -> None:
    """The longest prompt of every (item, template) the runs can draw (`data`: preflight's items), plus
    a full episode, fits max_model_len; a problem goes to `report` (preflight's). The prompt lengths
    are kept in `memo` for the arms of the same model and templates."""
    from ..train.task.codec import HfCodec

    pairs = [(it, "train") for it in data.train] + [(it, "eval") for it in data.heldout]
    for t in sorted({t for a in arms for t in a.templates}):
        pairs += [(it, t) for it in data.heldout]
    pairs = [(it, t) for it, t in pairs if t in _known_templates()]
    if not pairs:
        return
    key = ("prompts", model_key, tuple(sorted({t for _, t in pairs})))
    if key not in memo:  # the same model and templates: the same prompts (arms that change lr, say)
        memo[key] = _prompt_lengths(codec, pairs)
    lengths = memo[key]
    longest = max(range(len(pairs)), key=lengths.__getitem__)
    prompt = lengths[longest]
    if isinstance(codec, HfCodec):
        tool = codec.tool_output_bound(cfg.retrieval_top_k, cfg.passage_max_bytes)
    else:
        tool = cfg.retrieval_top_k * (cfg.passage_max_bytes + 2)
    need = prompt + cfg.max_turns * cfg.max_new_tokens + (cfg.max_turns - 1) * tool
    limit = cfg.max_model_len
    field_ = "train.model.max_model_len" if cfg.model is not None else "train.n_positions"
    item, template = pairs[longest]
    report.facts.update(longest_prompt_tokens=prompt, episode_tokens_at_most=need, max_model_len=limit)
    if need > limit:
        report.add(field_, f"{limit} tokens cannot hold the longest prompt ({prompt} tokens: item "
                   f"{item.item_id!r}, template {template!r}) + max_turns x max_new_tokens ({cfg.max_turns} x "
                   f"{cfg.max_new_tokens}) + tool output ({cfg.max_turns - 1} x at most {tool} tokens) = {need}")


def _known_templates() -> set[str]:
    from ..train.task.qa import TEMPLATES

    return set(TEMPLATES)


def _prompt_lengths(codec: Codec, pairs: list[tuple[Item, str]]) -> list[int]:
    """Prompt tokens of each (item, template), as the codec builds them (chat template rendered
    once per distinct text, tokenized in one batch)."""
    from ..train.task.codec import HfCodec
    from ..train.task.qa import render

    if not isinstance(codec, HfCodec) or any(it.single_turn for it, _ in pairs):  # a single-turn item's own prompt
        return [len(codec.prompt(t, it)) for it, t in pairs]
    contents = [codec.user_message(render(t, it)) for it, t in pairs]
    # The chat template around one user message is the same for every message: render it once around
    # a marker and splice; checked against a full rendering of the first prompt.
    marker = "\x00GGPO-CONTENT\x00"
    shell = codec.chat_text(marker)
    texts = None
    if shell.count(marker) == 1:
        head, tail = shell.split(marker)
        texts = [head + c + tail for c in contents]
        if texts[0] != codec.chat_text(contents[0]):
            texts = None
    if texts is None:
        texts = [codec.chat_text(c) for c in contents]
    return [len(ids) for ids in codec.tokenizer(texts, add_special_tokens=False)["input_ids"]]
