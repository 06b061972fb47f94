"""Chunked log-probs (train/logprobs.py) against the full-logits path: the ggpo loss and every
parameter's gradient agree to 1e-6 in float32, on tiny Qwen2 and Llama checkpoints and the built-in
byte GPT-2 (tied embeddings everywhere), for chunk sizes that do and do not divide the masked
length or the vocabulary, with tempered logits, environment-only tokens and gradient checkpointing."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from ggpo_batch.train.ggpo_config import GgpoConfig
from ggpo_batch.train.policy.ggpo import ggpo_loss
from ggpo_batch.train.policy.logprobs import Chunks, head_logprobs, masked_logprobs
from ggpo_batch.train.task.codec import ByteCodec

pytestmark = pytest.mark.train

UNCHUNKED = Chunks(tokens=0)
SIZES = [Chunks(1, 512), Chunks(7, 100), Chunks(13, 33), Chunks(1000, 1 << 20), Chunks(64, 1)]


class Banned(ByteCodec):
    """The byte codec's semantics with environment-only ids spread over several vocabulary chunks."""

    env_only_ids = (3, 99, 257, 400)


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):  # type: ignore[no-untyped-def]
    from ggpo_batch.train.task.tiny_hf import build_checkpoint

    return {arch: build_checkpoint(tmp_path_factory.mktemp(arch), arch=arch, vocab_size=512)
            for arch in ("qwen2", "llama")}


def load(folder, checkpointing: bool = False):  # type: ignore[no-untyped-def]
    from ggpo_batch.train.pretrained.hf import load_model

    return load_model(folder, dtype="float32", attn_implementation="eager", gradient_checkpointing=checkpointing)


def batch(vocab: int, seed: int = 0):  # type: ignore[no-untyped-def]
    """Right-padded rows with prompt, generated and tool spans: ids, attention, loss mask [B, T-1]."""
    g = torch.Generator().manual_seed(seed)
    lengths = [23, 17, 30, 9]
    T = max(lengths)
    ids = torch.randint(0, vocab, (len(lengths), T), generator=g)
    for banned in Banned.env_only_ids:  # the policy never generates them
        ids[ids == banned] = banned + 1
    attn = torch.zeros_like(ids)
    mask = torch.zeros((len(lengths), T - 1), dtype=torch.bool)
    for i, n in enumerate(lengths):
        attn[i, :n] = 1
        mask[i, 4 + i: n - 1] = True  # generated tokens after a prompt of 5 + i
        mask[i, 8: 10] = False  # a tool span in the middle
    ids[0, 12] = 99  # a banned (environment-only) target outside the mask
    mask[0, 11] = False
    return ids, attn, mask


def loss_and_grads(model, chunks: Chunks, codec, temperature: float = 0.8):  # type: ignore[no-untyped-def]
    ids, attn, mask = batch(model.config.vocab_size)
    model.zero_grad(set_to_none=True)
    logp = masked_logprobs(model, model, ids, attn, mask, temperature, codec, chunks)
    g = torch.Generator().manual_seed(1)
    behaviour = (logp.detach() + 0.05 * torch.randn(logp.shape, generator=g)).where(mask, 0.0)
    reference = (logp.detach() - 0.1 * torch.rand(logp.shape, generator=g)).where(mask, 0.0)
    adv = torch.tensor([1.0, -0.5, 0.7, -1.2])
    loss, _ = ggpo_loss(logp, behaviour, reference, adv, mask, GgpoConfig(kl_coef=0.05))
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return float(loss.detach()), logp.detach(), grads


def assert_same(a, b) -> None:  # type: ignore[no-untyped-def]
    (la, pa, ga), (lb, pb, gb) = a, b
    assert la == pytest.approx(lb, abs=1e-6)
    torch.testing.assert_close(pa, pb, atol=1e-6, rtol=1e-6)  # |log-p| ~ 6: a few float32 ulp
    assert ga.keys() == gb.keys() and ga
    for n in ga:
        torch.testing.assert_close(ga[n], gb[n], atol=1e-6, rtol=1e-5, msg=n)


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
@pytest.mark.parametrize("chunks", SIZES, ids=lambda c: f"t{c.tokens}v{c.vocab}")
def test_chunked_equals_unchunked_loss_and_gradients(checkpoints, arch, chunks):  # type: ignore[no-untyped-def]
    model = load(checkpoints[arch])
    assert model.get_output_embeddings().weight is model.get_input_embeddings().weight  # tied
    codec = Banned()
    assert_same(loss_and_grads(model, chunks, codec), loss_and_grads(model, UNCHUNKED, codec))


def test_gradient_checkpointing_gives_the_same_chunked_result(checkpoints):  # type: ignore[no-untyped-def]
    plain, ckpt = load(checkpoints["qwen2"]), load(checkpoints["qwen2"], checkpointing=True)
    assert ckpt.is_gradient_checkpointing and ckpt.training
    assert_same(loss_and_grads(ckpt, Chunks(5, 70), Banned()), loss_and_grads(plain, UNCHUNKED, Banned()))


def test_builtin_byte_gpt2_with_its_env_only_tokens() -> None:
    from ggpo_batch.train.config import TrainConfig
    from ggpo_batch.train.policy.model import build_model

    model = build_model(TrainConfig(), 3)
    codec = ByteCodec()
    assert codec.env_only_ids
    for chunks in (Chunks(3, 64), Chunks(11, 1000)):
        assert_same(loss_and_grads(model, chunks, codec, 1.0), loss_and_grads(model, UNCHUNKED, codec, 1.0))


def test_a_wrong_chunk_would_be_caught() -> None:
    """The comparison can fail: a head whose chunk loop skips the last vocabulary rows differs."""
    head = torch.nn.Linear(8, 50, bias=True)
    h, t = torch.randn(6, 8), torch.randint(0, 50, (6,))
    full = torch.log_softmax(head(h) / 0.7, -1).gather(1, t[:, None]).squeeze(1)
    good = head_logprobs(head, h, t, 0.7, (), Chunks(4, 7))
    torch.testing.assert_close(good, full, atol=1e-6, rtol=0)  # a biased head too
    short = torch.nn.Linear(8, 49, bias=True)
    short.weight.data, short.bias.data = head.weight.data[:49], head.bias.data[:49]
    bad = head_logprobs(short, h, t.clamp(max=48), 0.7, (), Chunks(4, 7))
    assert not torch.allclose(bad, full, atol=1e-6)


def test_peak_logits_memory_stays_within_a_chunk() -> None:
    """No [rows, tokens, vocabulary] float32 tensor: the largest tensor autograd saves is the hidden
    states, never a vocabulary-wide one (checked through saved-tensor hooks)."""
    head = torch.nn.Linear(16, 4096, bias=False)
    h = torch.randn(300, 16, requires_grad=True)
    t = torch.randint(0, 4096, (300,))
    saved: list[int] = []

    def pack(x):  # type: ignore[no-untyped-def]
        saved.append(x.numel())
        return x

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda x: x):
        head_logprobs(head, h, t, 1.0, (), Chunks(32, 512)).sum().backward()
    assert max(saved) <= max(h.numel(), head.weight.numel()) < 300 * 4096
    saved.clear()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda x: x):
        torch.log_softmax(head(h), -1).gather(1, t[:, None]).sum().backward()
    assert max(saved) >= 300 * 4096  # the plain path does save one: the check can see it
