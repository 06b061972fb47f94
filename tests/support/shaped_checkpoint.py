"""A checkpoint folder with a real model's shape and no real weights, for preflight at full scale.

`qwen3_1_7b(folder)` writes Qwen3-1.7B's config.json, a safetensors file whose header declares every
tensor of that shape and whose data is a sparse hole (zeros, nothing on disk), and the tiny BPE
tokenizer with a Qwen3-like hybrid chat template: preflight reads configs, tokenizers and safetensors
headers only, so it measures the flagship's model here as on the cluster.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

# Qwen3-1.7B's config.json (the fields preflight and transformers read).
QWEN3_1_7B = {
    "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": 2048, "intermediate_size": 6144,
    "num_hidden_layers": 28, "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128,
    "vocab_size": 151936, "max_position_embeddings": 40960, "tie_word_embeddings": True, "rms_norm_eps": 1e-6,
    "rope_theta": 1000000, "hidden_act": "silu", "attention_bias": False, "attention_dropout": 0.0,
    "bos_token_id": 151643, "eos_token_id": 151645, "torch_dtype": "bfloat16",
}


def tensor_shapes(config: dict) -> dict[str, list[int]]:
    """Every tensor of a Qwen3 decoder of `config` (tied embeddings: the LM head is the embedding)."""
    h, f, v = config["hidden_size"], config["intermediate_size"], config["vocab_size"]
    d, q, kv = config["head_dim"], config["num_attention_heads"], config["num_key_value_heads"]
    shapes = {"model.embed_tokens.weight": [v, h], "model.norm.weight": [h]}
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}."
        shapes.update({p + "self_attn.q_proj.weight": [q * d, h], p + "self_attn.k_proj.weight": [kv * d, h],
                       p + "self_attn.v_proj.weight": [kv * d, h], p + "self_attn.o_proj.weight": [h, q * d],
                       p + "self_attn.q_norm.weight": [d], p + "self_attn.k_norm.weight": [d],
                       p + "mlp.gate_proj.weight": [f, h], p + "mlp.up_proj.weight": [f, h],
                       p + "mlp.down_proj.weight": [h, f], p + "input_layernorm.weight": [h],
                       p + "post_attention_layernorm.weight": [h]})
    return shapes


def write_sparse_safetensors(path: Path, shapes: dict[str, list[int]], dtype: str = "BF16", itemsize: int = 2) -> int:
    """A valid safetensors file of zeros whose data is a hole (no disk used); returns the element count."""
    header, offset = {}, 0
    for name, shape in shapes.items():
        n = 1
        for s in shape:
            n *= s
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + n * itemsize]}
        offset += n * itemsize
    blob = json.dumps(header).encode()
    blob += b" " * (-len(blob) % 8)
    with open(path, "wb") as fh:
        fh.write(struct.pack("<Q", len(blob)) + blob)
        fh.truncate(8 + len(blob) + offset)
    return offset // itemsize


def qwen3_1_7b(folder: Path) -> Path:
    """`folder` as a Qwen3-1.7B-shaped checkpoint (module docstring); returns it."""
    from ggpo_batch.train.task.tiny_hf import THINKING_CHAT_TEMPLATE, _tokenizer_text, build_tokenizer, qa_rows

    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(QWEN3_1_7B))
    write_sparse_safetensors(folder / "model.safetensors", tensor_shapes(QWEN3_1_7B))
    build_tokenizer(folder, _tokenizer_text(*qa_rows(400)), chat_template=THINKING_CHAT_TEMPLATE)
    return folder
