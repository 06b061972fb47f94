"""tools/gpu/flops.py, the FLOP arithmetic of the GPU check, against counts written out by hand for
the --tiny shape and the flagship's; the peaks by device name; and the Python and transformers
floors flagship_check.py checks before anything else (exit 2, one line). Pure: no model is built."""

from __future__ import annotations

import configparser
import os
import subprocess
import sys

import pytest

from tests.support.paths import REPO
from tools.gpu.flops import (
    Forwards,
    PassShape,
    Shape,
    model_flops,
    pass_flops,
    peak_for,
    step_flops,
)

# --tiny (tools/gpu/flagship_train.TINY): 2 layers, hidden 64, 2 query heads / 1 key-value head of 32,
# MLP 128, vocabulary 1024, tied embeddings.
L, D, HEADS, KV, Q, MLP, V = 2, 64, 2, 1, 32, 128, 1024
BODY = L * (D * HEADS * Q + 2 * D * KV * Q + HEADS * Q * D + 3 * D * MLP + 2 * D + 2 * Q) + D  # 74,176
TINY = Shape(parameters=BODY + V * D, body_parameters=BODY, layers=L, heads=HEADS, head_dim=Q, hidden=D, vocab=V)


def test_the_tiny_shape_counts_as_written_out():
    from tools.gpu.flagship_train import TINY as CONFIG

    assert (CONFIG["num_hidden_layers"], CONFIG["hidden_size"], CONFIG["num_attention_heads"],
            CONFIG["num_key_value_heads"], CONFIG["head_dim"], CONFIG["intermediate_size"],
            CONFIG["vocab_size"]) == (L, D, HEADS, KV, Q, MLP, V)
    assert (BODY, TINY.parameters) == (74_176, 139_712)


def test_palm_model_flops_count_attention_over_the_whole_row():
    # One 96-token row: 96 x (6 x 139,712 + 12 x 2 x 2 x 32 x 96) = 96 x (838,272 + 147,456).
    assert model_flops(TINY, [96]) == 96 * 838_272 + 96 * 147_456 == 94_629_888
    # Rows count by their own length (not the pass's width): attention grows with T^2 a row.
    assert model_flops(TINY, [96, 48]) == 94_629_888 + 48 * (838_272 + 12 * 2 * 2 * 32 * 48)


def test_a_pass_counts_every_forward_the_trainer_runs():
    p = PassShape(lengths=(96,), width=96, loss_tokens=80)
    body = 2 * 74_176 * 96 + 4 * 2 * 2 * 32 * 96 * 96  # 14,241,792 + 4,718,592
    head = 2 * 64 * 1024 * 80  # 10,485,760: the LM head at the 80 targets only
    f = body + head
    assert body == 18_960_384 and f == 29_446_144
    # forward + backward (3f), checkpointing's body again, the chunked head's logits again, the reference;
    # the old log-probs taken from the update's own forward (the trainer's since issue 39).
    assert pass_flops(TINY, p, Forwards()) == 3 * f + body + head + f == 5 * f
    assert pass_flops(TINY, p, Forwards(old_logprobs=1)) == 6 * f  # a separate forward of the old log-probs
    assert pass_flops(TINY, p, Forwards(checkpointing=False, chunked_head=False, old_logprobs=0, reference=0)) == 3 * f
    # Padding is computed: two rows padded to 64 cost 2 x 64 tokens, attention 2 x 64^2.
    two = PassShape(lengths=(64, 40), width=64, loss_tokens=48 + 24)
    body2 = 2 * 74_176 * 2 * 64 + 4 * 2 * 2 * 32 * 2 * 64 * 64
    assert pass_flops(TINY, two, Forwards()) == 5 * (body2 + 2 * 64 * 1024 * 72)
    model, computed = step_flops(TINY, [p, two], Forwards())
    assert model == model_flops(TINY, [96, 64, 40]) and computed == 5 * f + 5 * (body2 + 2 * 64 * 1024 * 72)


def test_the_flagship_shape_per_token():
    """Qwen3-1.7B at T = 8192: PaLM's 6N + 12LHQT a token, N = 1,720,574,976 (tied embeddings once)."""
    n, lhq = 1_720_574_976, 28 * 16 * 128
    shape = Shape(parameters=n, body_parameters=n - 151_936 * 2048, layers=28, heads=16, head_dim=128, hidden=2048,
                  vocab=151_936)
    assert model_flops(shape, [8192]) == 8192 * (6 * n + 12 * lhq * 8192)
    assert 6 * n == 10_323_449_856 and 12 * lhq * 8192 == 5_637_144_576  # attention: 35% of the total at 8k


@pytest.mark.parametrize(("name", "board", "tflops"), [
    ("NVIDIA H100 80GB HBM3", "H100 SXM", 989.5), ("NVIDIA H100 PCIe", "H100 PCIe", 756.5),
    ("NVIDIA H100 NVL", "H100 NVL", 835.5), ("NVIDIA H200", "H200 SXM", 989.5), ("NVIDIA H200 NVL", "H200 NVL", 835.5),
    ("NVIDIA A100-SXM4-80GB", "A100", 312.0), ("NVIDIA A100 80GB PCIe", "A100", 312.0)])
def test_peaks_by_device_name(name, board, tflops):
    assert peak_for(name) == (board, tflops)


def test_the_peak_is_the_argument_else_the_device_names_else_none():
    from argparse import Namespace

    from tools.gpu.flagship_check import peak

    assert peak(Namespace(peak_tflops=500.0), "NVIDIA H200") == (500.0, "argument", None)
    assert peak(Namespace(peak_tflops=None), "NVIDIA H200") == (989.5, "device_name", "H200 SXM")
    assert peak(Namespace(peak_tflops=None), "NVIDIA GeForce RTX 4090") == (None, None, None)
    assert peak(Namespace(peak_tflops=None), None) == (None, None, None)  # the CPU


def test_version_floors():
    from tools.gpu.flagship_check import PYTHON_FLOOR, unmet_python, unmet_transformers

    cfg = configparser.ConfigParser()
    cfg.read(REPO / "setup.cfg")
    assert cfg["options"]["python_requires"] == f">={PYTHON_FLOOR[0]}.{PYTHON_FLOOR[1]}"
    assert unmet_python((3, 11, 0)) is None and unmet_python((3, 13, 1)) is None
    assert unmet_python((3, 10, 14)) == "error: Python 3.10.14 is older than the 3.11 this check and the package need"
    assert unmet_transformers("4.56.0") is None and unmet_transformers("5.19.0") is None
    assert unmet_transformers("4.55.4").startswith("error: transformers 4.55.4 is older than the 4.56.0 this check needs")
    assert unmet_python() is None and unmet_transformers() is None  # this venv's


def test_an_old_transformers_exits_2_with_one_line(tmp_path):
    """A transformers 4.40.0 distribution first on the path (its metadata: what the check reads)."""
    meta = tmp_path / "transformers-4.40.0.dist-info"
    meta.mkdir()
    (meta / "METADATA").write_text("Metadata-Version: 2.1\nName: transformers\nVersion: 4.40.0\n")
    env = dict(os.environ, PYTHONPATH=str(tmp_path))
    out = subprocess.run([sys.executable, str(REPO / "tools" / "gpu" / "flagship_check.py"), "--tiny"], cwd=REPO,
                         capture_output=True, text=True, timeout=60, env=env, check=False)
    assert out.returncode == 2, out.stderr
    line = ("error: transformers 4.40.0 is older than the 4.56.0 this check needs (from_pretrained(dtype=...) loads "
            "in that dtype; older versions ignore dtype= and load float32)")
    assert out.stderr.strip().splitlines() == [line]
