from __future__ import annotations

import torch

from ggpo_batch.nightly import checks
from ggpo_batch.nightly.checks import extreme_finite_padding_zero_gradients, oversized_corpus_rejected_before_read
from ggpo_batch.nightly.corpus import CorpusError
from ggpo_batch.train.policy.ggpo import GgpoConfig, ggpo_loss


def test_oversized_check_observes_the_refusal():
    assert oversized_corpus_rejected_before_read(4 << 20) is True


def test_oversized_check_fails_for_a_loader_that_reads_first(monkeypatch):
    def reads_then_refuses(path, **kw):
        path.read_bytes()
        raise CorpusError(f"{path}: corpus is big, over the cap of {kw['max_bytes']} bytes; not read")

    monkeypatch.setattr(checks, "load_file", reads_then_refuses)
    assert oversized_corpus_rejected_before_read(1000) is False


def _sanitised_loss(logprobs, behaviour, reference, advantages, mask, config):
    # a loss that neutralises padding before any exp(): what the check demands
    zero = torch.zeros_like(logprobs)
    return ggpo_loss(torch.where(mask, logprobs, zero), torch.where(mask, behaviour, zero),
                     torch.where(mask, reference, zero), advantages, mask, config)


def test_padding_check_separates_a_safe_loss_from_an_unsafe_one(monkeypatch):
    config = GgpoConfig(group_size=4)
    monkeypatch.setattr(checks, "ggpo_loss", _sanitised_loss)
    assert extreme_finite_padding_zero_gradients(config) is True

    def unmasked_mean(logprobs, behaviour, reference, advantages, mask, config):
        loss = -(torch.exp(logprobs - behaviour) * advantages[:, None]).mean()
        return loss, None

    monkeypatch.setattr(checks, "ggpo_loss", unmasked_mean)
    assert extreme_finite_padding_zero_gradients(config) is False


def test_padding_check_on_the_real_ggpo_loss_matches_a_direct_probe():
    # The check's verdict on ggpo_batch.train.policy.ggpo must agree with a direct look at NaNs.
    config = GgpoConfig(group_size=4)
    lp = torch.tensor([[-1.0, 0.0]], requires_grad=True)
    loss, _ = ggpo_loss(lp, torch.tensor([[-1.0, -1e4]]), torch.tensor([[-1.0, -1e4]]), torch.tensor([1.0]),
                        torch.tensor([[True, False]]), config)
    loss.backward()
    direct_ok = bool(torch.isfinite(loss)) and bool(torch.isfinite(lp.grad).all()) and lp.grad[0, 1] == 0
    # ggpo_loss zeroes masked log-probs before exp(), so both the direct look and the check pass
    assert direct_ok
    assert extreme_finite_padding_zero_gradients(config) is True
