"""A model family's metadata laid onto a tiny checkpoint: the family's chat template, special tokens,
token-id keys and config quirks on a small BPE vocabulary and a randomly initialised model of the
family's architecture, so preflight and a training step meet the family's chat format on a CPU.

`build(source, folder)` reads the family folder `source` (config.json, tokenizer_config.json, and
generation_config.json / chat_template.json where it has them) and writes `folder`:

- the tokenizer: a byte-level BPE trained on the QA text (tiny_hf.py), with the family's special
  tokens added (those of added_tokens_decoder that the template, the config's ids or the named
  bos/eos/pad/unk tokens use, else the ones the template writes), and the tokenizer_config values
  that matter kept as they are (model_max_length, the int(1e30) "unset" included);
- the ids of config.json and generation_config.json renumbered onto the tiny tokenizer; the
  embeddings as many as its tokens, one fewer where the family's own tokenizer is larger than its
  embeddings (gemma-3-1b-it's `<image_soft_token>`);
- config.json's sizes shrunk (hidden size, layers, heads, experts), every other key kept;
- chat_template.json copied where the family keeps its template there.

The template is the family's own, read from `source` at build time: nothing of it is written into
this project.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

# Spellings of special tokens in chat templates: <|eot_id|>, <｜Assistant｜>, <start_of_turn>,
# [INST], <think>, <s>.
_TEMPLATE_TOKEN = re.compile(r"<\|[^|<>\s]+\|>|<｜[^｜]+｜>|<(?:start|end)_of_turn>|\[/?[A-Z_]+\]|</?think>|</?s>")
SHRUNK = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 2,
          "num_key_value_heads": 1, "head_dim": 32, "num_local_experts": 2, "num_experts_per_tok": 1,
          "sliding_window": 64}
# Keys sized by the real layer count or head size: dropped (their defaults fit the shrunk model).
DROPPED = ("layer_types", "max_window_layers", "rope_scaling", "quantization_config", "sliding_window_pattern")
ID_KEYS = ("bos_token_id", "eos_token_id", "pad_token_id")
# Tokenizer classes transformers rebuilds from a SentencePiece-style vocabulary.
SENTENCEPIECE_CLASSES = ("GemmaTokenizer", "GemmaTokenizerFast", "LlamaTokenizer")


def _token(value: Any) -> str | None:
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def _read(source: Path, name: str) -> dict[str, Any]:
    path = source / name
    return json.loads(path.read_text()) if path.is_file() else {}


def special_tokens(tok_config: dict[str, Any], config: dict[str, Any], template: str) -> tuple[list[str], dict[int, str]]:
    """(the family's special tokens the tiny tokenizer carries, their real ids where known)."""
    decoder = {int(i): _token(t) for i, t in (tok_config.get("added_tokens_decoder") or {}).items()}
    named = [_token(tok_config.get(k)) for k in ("bos_token", "eos_token", "pad_token", "unk_token")]
    ids = set()
    for key in ID_KEYS:
        value = config.get(key)
        ids.update(value if isinstance(value, list) else [value])
    wanted = {t for t in named if t} | set(_TEMPLATE_TOKEN.findall(template))
    wanted |= {decoder[i] for i in ids if decoder.get(i)}
    real = {i: t for i, t in decoder.items() if t in wanted}
    return sorted(wanted, key=lambda t: (min((i for i, s in real.items() if s == t), default=1 << 40), t)), real


def _byte_level_bpe(text: list[str], size: int, specials: list[str]) -> Any:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=size, special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    bpe.train_from_iterator(text, trainer=trainer)
    return bpe


def _sentencepiece_bpe(text: list[str], size: int, specials: list[str]) -> Any:
    """A SentencePiece-style BPE (spaces as "▁", bytes it lacks as <0x..> pieces, as Gemma's, Llama-2's,
    Mistral's and Phi-3's): transformers rebuilds those tokenizer classes from the vocabulary and
    merges, which a byte-level BPE does not survive (every space becomes <unk>)."""
    from tokenizers import Tokenizer, decoders, models, normalizers, trainers

    bpe = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True))
    bpe.normalizer = normalizers.Replace(" ", "▁")
    trainer = trainers.BpeTrainer(vocab_size=size - 256, special_tokens=specials, show_progress=False)
    bpe.train_from_iterator(text, trainer=trainer)
    model = json.loads(bpe.to_str())["model"]
    pieces = sorted(model["vocab"], key=model["vocab"].get)
    head = [p for p in pieces if p in specials]
    vocab = {p: i for i, p in enumerate(head + [f"<0x{b:02X}>" for b in range(256)]
                                        + [p for p in pieces if p not in specials])}
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in model["merges"]]
    out = Tokenizer(models.BPE(vocab, merges, unk_token="<unk>" if "<unk>" in vocab else None, byte_fallback=True))
    out.normalizer = normalizers.Replace(" ", "▁")
    out.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()])
    out.add_special_tokens(head)
    return out


def _renumber(value: Any, real: dict[int, str], ids: dict[str, int], fallback: int | None) -> Any:
    one = (lambda i: ids.get(real.get(i, ""), fallback))
    if isinstance(value, list):
        return list(dict.fromkeys(x for x in map(one, value) if x is not None))
    return one(value) if isinstance(value, int) else value


def build(source: Path, folder: Path, *, vocab_size: int = 512) -> Path:
    """`folder` as the tiny checkpoint of the family in `source` (module docstring); returns it."""
    import torch
    from transformers import (
        AutoConfig,
        AutoModelForCausalLM,
        GenerationConfig,
        PreTrainedTokenizerFast,
    )

    from .tiny_hf import PROTOCOL_TAGS, _tokenizer_text, qa_rows

    source, folder = Path(source), Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tok_config, config = _read(source, "tokenizer_config.json"), _read(source, "config.json")
    generation, template_json = _read(source, "generation_config.json"), _read(source, "chat_template.json")
    template = tok_config.get("chat_template") or template_json.get("chat_template") or ""
    specials, real = special_tokens(tok_config, config.get("text_config", config), template)

    sentencepiece = tok_config.get("tokenizer_class") in SENTENCEPIECE_CLASSES
    bpe = (_sentencepiece_bpe if sentencepiece else _byte_level_bpe)(
        _tokenizer_text(*qa_rows(400)), vocab_size - len(PROTOCOL_TAGS), specials)
    bpe.add_tokens(list(PROTOCOL_TAGS))
    # The family's tokenizer larger than its embeddings (gemma-3-1b-it: <image_soft_token> at id
    # 262144 of 262144): its last token, special, stays the one past the tiny embeddings.
    decoder = {int(i): _token(t) for i, t in (tok_config.get("added_tokens_decoder") or {}).items()}
    text = dict(config.get("text_config", config))
    top = max(decoder, default=-1)
    overhang = top >= int(text.get("vocab_size", 1 << 62)) and bool(decoder[top])
    if overhang:
        bpe.add_special_tokens([decoder[top]])
    named = {k: _token(tok_config.get(k)) for k in ("bos_token", "eos_token", "pad_token", "unk_token")}
    tok = PreTrainedTokenizerFast(tokenizer_object=bpe, **named,
                                  chat_template=None if template_json else (template or None))
    tok.save_pretrained(folder)
    saved = json.loads((folder / "tokenizer_config.json").read_text())
    for key in ("model_max_length", "add_bos_token", "add_eos_token", "clean_up_tokenization_spaces",
                "tokenizer_class", "legacy"):
        if key in tok_config:
            saved[key] = tok_config[key]
    (folder / "tokenizer_config.json").write_text(json.dumps(saved, indent=2))
    if template_json:
        (folder / "chat_template.json").write_text(json.dumps(template_json))
    ids = {t: tok.convert_tokens_to_ids(t) for t in specials}

    text.update({k: v for k, v in SHRUNK.items() if k in text or k in ("hidden_size", "num_hidden_layers")})
    for key in DROPPED:
        text.pop(key, None)
    text["vocab_size"] = len(tok) - (1 if overhang else 0)
    for key, fallback in zip(ID_KEYS, (tok.bos_token_id, tok.eos_token_id, tok.pad_token_id)):
        if key in text:
            text[key] = _renumber(text[key], real, ids, fallback)
    text.pop("torch_dtype", None)
    text.pop("dtype", None)
    cfg = AutoConfig.for_model(**text)
    for key, fallback in zip(ID_KEYS, (tok.bos_token_id, tok.eos_token_id, tok.pad_token_id)):
        value = getattr(cfg, key, None)  # a config class's own default (Phi-3's pad_token_id 32000)
        if isinstance(value, int) and value >= text["vocab_size"]:
            setattr(cfg, key, fallback)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg)
    if generation:
        kept = {k: _renumber(v, real, ids, getattr(tok, k, None)) if k in ID_KEYS else v for k, v in generation.items() if not k.startswith("_") and k != "transformers_version"}
        model.generation_config = GenerationConfig(**kept)
    model.save_pretrained(folder, safe_serialization=True)
    if not generation:
        (folder / "generation_config.json").unlink(missing_ok=True)
    return folder
