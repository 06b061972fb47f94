"""Family shapes of our own: for each popular model family, a minimal chat template written here that
reproduces the family's turn format and quirk, its special tokens, and the config and tokenizer
keys that matter (the SentencePiece tokenizer classes of Gemma, Mistral and Phi-3 among them),
written as a family folder that `ggpo_batch.train.task.tiny_family.build` lays onto a
tiny checkpoint (tools/check/real_models.py does the same with real families' files).

`Family.refusal` is what preflight says of it without keywords (None: it passes), `kwargs` what
the spec must set, `end` the chat format's end of turn.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

UNSET_MAX_LENGTH = 1000000000000000019884624838656  # int(1e30), as save_pretrained writes it

CHATML = ("{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>\n' }}{% endfor %}"
          "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
HYBRID = CHATML.replace("{% endif %}", "{% if enable_thinking is defined and enable_thinking is false %}"
                                       "{{ '<think>\n\n</think>\n\n' }}{% endif %}{% endif %}")
THINKING_ONLY = CHATML.replace("'<|im_start|>assistant\n'", "'<|im_start|>assistant\n<think>\n'")
LLAMA3 = ("{{ bos_token }}{% if not date_string is defined %}{% if strftime_now is defined %}"
          "{% set date_string = strftime_now('%d %b %Y') %}{% else %}{% set date_string = '26 Jul 2024' %}{% endif %}"
          "{% endif %}{{ '<|start_header_id|>system<|end_header_id|>\n\nToday Date: ' + date_string + '<|eot_id|>' }}"
          "{% for m in messages %}{{ '<|start_header_id|>' + m['role'] + '<|end_header_id|>\n\n' + m['content'] + "
          "'<|eot_id|>' }}{% endfor %}{% if add_generation_prompt %}"
          "{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}")
LLAMA31 = LLAMA3.replace("{% if strftime_now is defined %}{% set date_string = strftime_now('%d %b %Y') %}"
                         "{% else %}{% set date_string = '26 Jul 2024' %}{% endif %}", "{% set date_string = '26 Jul 2024' %}")
MISTRAL = ("{{ bos_token }}{% for m in messages %}{% if m['role'] == 'user' %}{{ '[INST] ' + m['content'] + ' [/INST]' }}"
           "{% else %}{{ ' ' + m['content'] + eos_token }}{% endif %}{% endfor %}")
GEMMA = ("{{ bos_token }}{% for m in messages %}{% if m['role'] == 'assistant' %}{% set role = 'model' %}"
         "{% else %}{% set role = m['role'] %}{% endif %}"
         "{{ '<start_of_turn>' + role + '\n' + m['content'] + '<end_of_turn>\n' }}{% endfor %}"
         "{% if add_generation_prompt %}{{ '<start_of_turn>model\n' }}{% endif %}")
PHI3 = ("{% for m in messages %}{{ '<|' + m['role'] + '|>\n' + m['content'] + '<|end|>\n' }}{% endfor %}"
        "{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% else %}{{ eos_token }}{% endif %}")
R1 = ("{{ bos_token }}{% for m in messages %}{% if m['role'] == 'user' %}{{ '<｜User｜>' + m['content'] }}"
      "{% else %}{{ '<｜Assistant｜>' + m['content'] + '<｜end▁of▁sentence｜>' }}{% endif %}{% endfor %}"
      "{% if add_generation_prompt %}{{ '<｜Assistant｜>' }}{% endif %}")
R1_THINK = R1.replace("{{ '<｜Assistant｜>' }}{% endif %}", "{{ '<｜Assistant｜><think>\n' }}{% endif %}")

QWEN2 = {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "vocab_size": 151936, "hidden_size": 2048,
         "max_position_embeddings": 32768, "tie_word_embeddings": True}
LLAMA = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 128256,
         "max_position_embeddings": 131072, "hidden_size": 2048}
MISTRAL_CONFIG = {"architectures": ["MistralForCausalLM"], "model_type": "mistral", "vocab_size": 32768,
                  "max_position_embeddings": 32768, "hidden_size": 4096, "sliding_window": None}
GEMMA3 = {"architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text", "vocab_size": 262144,
          "max_position_embeddings": 32768, "hidden_size": 1152, "bos_token_id": 2, "eos_token_id": [1, 106]}
PHI = {"architectures": ["Phi3ForCausalLM"], "model_type": "phi3", "vocab_size": 32064,
       "max_position_embeddings": 4096, "hidden_size": 3072}


@dataclass(frozen=True)
class Family:
    name: str
    template: str
    config: dict[str, Any]
    tokens: dict[str, str]  # bos/eos/pad token of tokenizer_config.json
    end: str
    refusal: str | None = None
    kwargs: str = ""
    extra: dict[str, Any] = field(default_factory=dict)  # more tokenizer_config.json keys
    template_json: bool = False  # the template in chat_template.json only (Gemma-3 4B and up)
    added: tuple[tuple[int, str], ...] = ()  # (real id, token) of added_tokens_decoder


FAMILIES = (
    Family("qwen2.5", CHATML, QWEN2, {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}, "<|im_end|>"),
    Family("qwen3", HYBRID, QWEN2, {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}, "<|im_end|>",
           "thinking switch `enable_thinking`", "enable_thinking = false"),
    Family("qwen3-thinking", THINKING_ONLY, QWEN2, {"eos_token": "<|im_end|>"}, "<|im_end|>", "open <think> reasoning block"),
    Family("llama-3.1", LLAMA31, LLAMA, {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"}, "<|eot_id|>"),
    Family("llama-3.2", LLAMA3, LLAMA, {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"}, "<|eot_id|>",
           "today's date", 'date_string = "26 Jul 2024"'),
    Family("mistral", MISTRAL, MISTRAL_CONFIG, {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}, "</s>",
           extra={"tokenizer_class": "LlamaTokenizer"}),
    Family("gemma-3", GEMMA, GEMMA3, {"bos_token": "<bos>", "eos_token": "<eos>", "pad_token": "<pad>"}, "<end_of_turn>",
           extra={"model_max_length": UNSET_MAX_LENGTH, "tokenizer_class": "GemmaTokenizer"},
           added=((0, "<pad>"), (1, "<eos>"), (2, "<bos>"), (105, "<start_of_turn>"), (106, "<end_of_turn>"),
                  (262144, "<image_soft_token>"))),
    Family("gemma-3-template-json", GEMMA, GEMMA3, {"bos_token": "<bos>", "eos_token": "<eos>", "pad_token": "<pad>"},
           "<end_of_turn>", extra={"model_max_length": UNSET_MAX_LENGTH, "tokenizer_class": "GemmaTokenizer"},
           template_json=True,
           added=((0, "<pad>"), (1, "<eos>"), (2, "<bos>"), (105, "<start_of_turn>"), (106, "<end_of_turn>"),
                  (262144, "<image_soft_token>"))),
    Family("phi-3", PHI3, PHI, {"bos_token": "<s>", "eos_token": "<|endoftext|>", "unk_token": "<unk>"}, "<|end|>",
           extra={"tokenizer_class": "LlamaTokenizer"}),
    Family("r1-distill", R1, QWEN2, {"bos_token": "<｜begin▁of▁sentence｜>", "eos_token": "<｜end▁of▁sentence｜>"},
           "<｜end▁of▁sentence｜>"),
    Family("r1-distill-think", R1_THINK, QWEN2, {"bos_token": "<｜begin▁of▁sentence｜>",
                                                  "eos_token": "<｜end▁of▁sentence｜>"}, "<｜end▁of▁sentence｜>",
           "open <think> reasoning block"),
)


def write_family(family: Family, folder: Path) -> Path:
    """`folder` as the family's metadata folder (config.json, tokenizer_config.json, chat_template.json)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(family.config))
    tok: dict[str, Any] = {**family.tokens, **family.extra}
    if family.added:
        tok["added_tokens_decoder"] = {str(i): {"content": t, "special": True} for i, t in family.added}
    if family.template_json:
        (folder / "chat_template.json").write_text(json.dumps({"chat_template": family.template}))
    else:
        tok["chat_template"] = family.template
    (folder / "tokenizer_config.json").write_text(json.dumps(tok))
    return folder
