"""A tiny pretrained-format checkpoint and a multi-hop QA set, built offline from generated text.

For tests, benchmarks and a CPU demo of the real-model path: `build_qa_set` writes train/eval/
passages JSONL in the `[train.data]` format (two-hop questions: each answer needs two passages);
`build_checkpoint` trains a byte-level BPE tokenizer (the `tokenizers` library) on that text, gives
it a ChatML chat template, and saves a small randomly initialised Llama- or Qwen2-architecture
causal LM beside it with `save_pretrained` (config, safetensors, tokenizer files), so
`AutoModelForCausalLM` / `AutoTokenizer` load it like any Hugging Face checkpoint. Nothing is
downloaded; the same arguments give the same files.
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Iterable
from pathlib import Path

_SYLLABLES = ("ka", "zo", "ri", "mel", "tun", "vo", "sha", "dra", "ne", "pul", "quo", "bex", "lin", "tor",
              "av", "sel", "mor", "ith", "gan", "ul")

_GOODS = ("salt", "wool", "copper", "amber", "grain", "silk", "tin", "honey")

# ChatML, the format of the Qwen instruct models; `add_generation_prompt` opens the assistant turn.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
# ChatML with Qwen3's thinking switch (the end of Qwen3's hybrid template): it thinks by default and
# shows nothing of it in the prompt; `enable_thinking=False` writes an empty reasoning block after the
# generation prompt. For tests of `[train.model] chat_template_kwargs` (train/chat_template.py).
THINKING_CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\n\n</think>\n\n' }}{%- endif %}"
    "{%- endif %}"
)
# A thinking-only template (as Qwen3-Thinking-2507's and DeepSeek-R1's): the generation prompt opens
# the reasoning block itself, and no keyword closes it (what train/chat_template.check must refuse
# whatever the spec's keywords).
ALWAYS_THINKING_CHAT_TEMPLATE = CHAT_TEMPLATE.replace("'<|im_start|>assistant\n'",
                                                      "'<|im_start|>assistant\n<think>\n'")
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")


def _protocol_tags() -> tuple[str, ...]:
    from .codec import ANSWER_CLOSE, ANSWER_OPEN, INFO_CLOSE, INFO_OPEN, SEARCH_CLOSE, SEARCH_OPEN

    return (SEARCH_OPEN, SEARCH_CLOSE, INFO_OPEN, INFO_CLOSE, ANSWER_OPEN, ANSWER_CLOSE)


PROTOCOL_TAGS = _protocol_tags()


def _name(rng: random.Random, parts: int) -> str:
    return "".join(rng.choice(_SYLLABLES) for _ in range(parts)).capitalize()


def qa_rows(n_items: int, seed: int = 0) -> tuple[list[dict], list[dict]]:
    """(items, passages): two-hop questions "Where was the founder of P born?" over invented facts."""
    rng = random.Random(seed)
    used: set[str] = set()

    def fresh(parts: int) -> str:
        for _ in range(10_000):
            name = _name(rng, parts)
            if name not in used:
                used.add(name)
                return name
        raise ValueError(f"too many items for invented names of {parts} syllables")

    items, passages = [], []
    for i in range(n_items):
        place, founder, city = fresh(3), fresh(3), fresh(3)
        t1, t2 = f"{place} (founding)", f"{founder} (birth)"
        passages.append({"title": t1, "text": f"{place} was founded by {founder}."})
        passages.append({"title": t2, "text": f"{founder} was born in {city}."})
        passages.append({"title": f"{place} (trade)", "text": f"{place} trades {rng.choice(_GOODS)} with {city}."})
        items.append({"id": f"mh-{i:04d}", "question": f"Where was the founder of {place} born?",
                      "answers": [city], "support_titles": [t1, t2]})
    rng.shuffle(passages)
    return items, passages


def write_jsonl(path: Path, rows: Iterable[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def build_qa_set(folder: Path, *, n_train: int = 200, n_eval: int = 200, seed: int = 0) -> dict[str, Path]:
    """train.jsonl, eval.jsonl and passages.jsonl under `folder`; returns their paths by [train.data] key."""
    folder = Path(folder)
    items, passages = qa_rows(n_train + n_eval, seed)
    return {"train": write_jsonl(folder / "train.jsonl", items[:n_train]),
            "eval": write_jsonl(folder / "eval.jsonl", items[n_train:]),
            "passages": write_jsonl(folder / "passages.jsonl", passages)}


def _tokenizer_text(items: list[dict], passages: list[dict]) -> list[str]:
    from .codec import instruction
    from .qa import TEMPLATES

    lines = [instruction(), "".join(_protocol_tags())]
    lines += [f"{p['title']}: {p['text']}" for p in passages]
    lines += [t.format(question=i["question"]) + " " + i["answers"][0] for i in items for t in TEMPLATES.values()]
    return lines


def build_tokenizer(folder: Path, text: list[str], vocab_size: int = 512,  # type: ignore[no-untyped-def]
                    chat_template: str = CHAT_TEMPLATE):
    """A byte-level BPE tokenizer trained on `text`, with ChatML special tokens and `chat_template`."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size - len(PROTOCOL_TAGS), special_tokens=list(SPECIAL_TOKENS),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(text, trainer=trainer)
    # The protocol's tags as added (not special) tokens, as instruct vocabularies hold their tool tags
    # (Qwen's <tool_call>): one token each, kept by decode(skip_special_tokens=True).
    tok.add_tokens(list(PROTOCOL_TAGS))
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                   bos_token=None, unk_token=None, chat_template=chat_template,
                                   model_max_length=1 << 16)
    fast.save_pretrained(folder)
    return fast


def build_checkpoint(folder: Path, *, arch: str = "qwen2", hidden: int = 64, layers: int = 2, heads: int = 2,
                     kv_heads: int = 1, max_positions: int = 8192, vocab_size: int = 512, seed: int = 0,
                     qa_seed: int = 0, chat_template: str = CHAT_TEMPLATE) -> Path:
    """A tiny causal LM (`arch` qwen2 or llama) with its BPE tokenizer (and `chat_template`) in
    `folder`; returns `folder`."""
    import torch
    from transformers import (
        GenerationConfig,
        LlamaConfig,
        LlamaForCausalLM,
        Qwen2Config,
        Qwen2ForCausalLM,
    )

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    items, passages = qa_rows(400, qa_seed)
    tok = build_tokenizer(folder, _tokenizer_text(items, passages), vocab_size, chat_template)
    eos, pad = tok.convert_tokens_to_ids("<|im_end|>"), tok.convert_tokens_to_ids("<|endoftext|>")
    common = {"vocab_size": max(vocab_size, len(tok)), "hidden_size": hidden, "intermediate_size": 2 * hidden,
              "num_hidden_layers": layers, "num_attention_heads": heads, "num_key_value_heads": kv_heads,
              "max_position_embeddings": max_positions, "eos_token_id": eos, "pad_token_id": pad,
              "bos_token_id": None, "tie_word_embeddings": True, "rms_norm_eps": 1e-6}
    if arch == "qwen2":
        config, cls = Qwen2Config(**common, use_sliding_window=False), Qwen2ForCausalLM
    elif arch == "llama":
        config, cls = LlamaConfig(**common), LlamaForCausalLM
    else:
        raise ValueError(f"arch must be qwen2 or llama, got {arch!r}")
    torch.manual_seed(seed)
    model = cls(config)
    model.generation_config = GenerationConfig(eos_token_id=eos, pad_token_id=pad)
    model.save_pretrained(folder, safe_serialization=True)
    return folder


def with_chat_template(source: Path, folder: Path, template: str) -> Path:
    """A copy of the checkpoint `source` in `folder` whose tokenizer carries `template` instead."""
    import shutil

    from ..pretrained.hf import load_tokenizer

    shutil.copytree(source, folder)
    tok = load_tokenizer(folder)
    tok.chat_template = template
    tok.save_pretrained(folder)
    return Path(folder)


def set_turn_lengths(folder: Path, *, search_share: float, search_mean: float, answer_mean: float) -> Path:
    """Rewrite the checkpoint in `folder` (built by `build_checkpoint`) into a model whose episodes have
    a known shape, for benchmarks and tests: a turn is a search call (`<search>` words `</search>`,
    probability `search_share`) or the answer (`<answer>` words, then the end of turn), and its words
    run on with a constant chance of stopping, so a search call holds `search_mean` words on average
    and an answer `answer_mean` (geometric: a step's answers vary over 10x in length).

    How: a Markov chain over tokens, which a transformer computes when every layer's output
    projections are zero (the residual stream is the current token's embedding). Each token belongs
    to one class -- search words (word tokens with a leading space, half of them), answer words (the
    other letter-only tokens), `<search>`, `<answer>`, anything else (the ends of prompts and tool
    output) -- whose embedding is one unit vector; the untied LM head reads the next token's
    log-probabilities off it."""
    import re

    import torch
    from transformers import (
        AutoConfig,
        AutoModelForCausalLM,
        AutoTokenizer,
        GenerationConfig,
    )

    from .codec import ANSWER_OPEN, SEARCH_CLOSE, SEARCH_OPEN

    folder = Path(folder)
    config = AutoConfig.from_pretrained(folder)
    config.tie_word_embeddings = False
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config)  # every weight that matters is set below
    tok = AutoTokenizer.from_pretrained(folder)
    ids = tok.convert_tokens_to_ids
    text = {i: tok.decode([i]) for i in range(len(tok))}
    spaced = [i for i, t in text.items() if re.fullmatch(r" [a-zA-Z]+", t)]
    search_words = spaced[::2]
    answer_words = spaced[1::2] + [i for i, t in text.items() if re.fullmatch(r"[a-zA-Z]+", t)]
    open_search, open_answer, close_search, end = ids(SEARCH_OPEN), ids(ANSWER_OPEN), ids(SEARCH_CLOSE), ids("<|im_end|>")
    classes = [search_words, answer_words, [open_search], [open_answer]]  # class 4: every other token
    never = -60.0

    def row(choices: list[tuple[list[int], float]]) -> torch.Tensor:
        """Next-token log-probabilities: each (tokens, probability) spread evenly over its tokens."""
        logp = torch.full((config.vocab_size,), never)
        for tokens, p in choices:
            logp[tokens] = math.log(p / len(tokens))
        return logp

    stop_search, stop_answer = 1.0 / search_mean, 1.0 / answer_mean
    nexts = [row([(search_words, 1 - stop_search), ([close_search], stop_search)]),
             row([(answer_words, 1 - stop_answer), ([end], stop_answer)]),
             row([(search_words, 1.0)]), row([(answer_words, 1.0)]),
             row([([open_search], search_share), ([open_answer], 1 - search_share)])]
    scale = math.sqrt(config.hidden_size)  # an RMS-normed unit vector has this length
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(("o_proj.weight", "down_proj.weight")):
                p.zero_()
        emb, head = model.get_input_embeddings().weight, model.get_output_embeddings().weight
        emb.zero_()
        emb[:, len(classes)] = 1.0
        for c, tokens in enumerate(classes):
            emb[tokens] = 0.0
            emb[tokens, c] = 1.0
        head.zero_()
        for c, logp in enumerate(nexts):
            head[:, c] = logp / scale
    for f in folder.glob("model*.safetensors*"):
        f.unlink()
    model.generation_config = GenerationConfig.from_pretrained(folder)
    model.save_pretrained(folder, safe_serialization=True)
    return folder


def main(argv: list[str] | None = None) -> int:
    """`python -m ggpo_batch.train.task.tiny_hf OUT`: OUT/model (the checkpoint) and OUT/qa (the JSONL files),
    what jobs/hf-tiny-cpu.toml names."""
    import argparse

    ap = argparse.ArgumentParser(description=main.__doc__)
    ap.add_argument("out", type=Path, nargs="?", default=Path("out/tiny-hf"))
    args = ap.parse_args(argv)
    model = build_checkpoint(args.out / "model")
    files = build_qa_set(args.out / "qa")
    print(f"checkpoint {model}; data {', '.join(str(p) for p in files.values())}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
