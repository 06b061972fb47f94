from __future__ import annotations

import torch

from ggpo_batch.nightly.policy import EOS, VOCAB, BytePolicy, PolicyConfig, flat_parameters, sample


def test_policy_is_causal():
    torch.manual_seed(0)
    model = BytePolicy(PolicyConfig(width=24))
    ids = torch.randint(0, VOCAB, (2, 10))
    changed = ids.clone()
    changed[:, 6:] = (changed[:, 6:] + 1) % VOCAB
    a, b = model(ids), model(changed)
    assert a.shape == (2, 10, VOCAB)
    assert torch.equal(a[:, :6], b[:, :6]) and not torch.equal(a[:, 6:], b[:, 6:])


def test_sample_counts_lengths_and_natural_eos():
    torch.manual_seed(0)
    model = BytePolicy(PolicyConfig(width=24))
    with torch.no_grad():  # make EOS likely so some rollouts stop early
        model.head.bias[EOS] = 4.0
    r = sample(model, torch.tensor([72, 105]), 32, 8, torch.Generator().manual_seed(1))
    assert r.tokens.shape == (32, 8) and model.sampled_tokens == r.generated_tokens == int(r.lengths.sum())
    for row, n, nat in zip(r.tokens, r.lengths.tolist(), r.natural_eos.tolist()):
        assert 1 <= n <= 8
        assert nat == (row[n - 1].item() == EOS)
        assert (row[n:] == EOS).all()  # padding after the end
        assert not (row[: n - 1] == EOS).any()  # no EOS before the end
    assert 0 < int(r.natural_eos.sum()) < 32


def test_flat_parameters_is_a_snapshot():
    model = BytePolicy(PolicyConfig(width=8))
    before = flat_parameters(model)
    with torch.no_grad():
        model.head.bias.add_(1.0)
    assert not torch.equal(before, flat_parameters(model))
