"""The ggpo update itself: group-relative advantages and the masked, clipped, KL-penalised loss."""

from __future__ import annotations

import pytest
import torch

from ggpo_batch.train.policy.ggpo import GgpoConfig, ggpo_loss, group_advantages, token_logprobs, truncated_is_weights


def test_equal_reward_groups_are_dropped_and_advantages_are_standardised() -> None:
    rewards = torch.tensor([[1.0, 0.0, 0.0, 1.0], [1.0, 1.0, 1.0, 1.0], [0.0, 0.0, 0.0, 3.0]])
    g = group_advantages(rewards, eps=0.0)
    assert g.retained.tolist() == [True, False, True]
    assert (g.retained_groups, g.rejected_groups) == (2, 1)
    assert g.advantages[1].tolist() == [0.0, 0.0, 0.0, 0.0]
    assert g.advantages[0].tolist() == pytest.approx([1.0, -1.0, -1.0, 1.0])
    assert float(g.advantages[2].mean()) == pytest.approx(0.0, abs=1e-6)
    assert float(g.advantages[2].std(unbiased=False)) == pytest.approx(1.0)
    assert g.raw_gap == pytest.approx((1.0 + 3.0) / 2)


def test_loss_touches_only_masked_tokens() -> None:
    cfg = GgpoConfig(group_size=2, kl_coef=0.1)
    lp = torch.tensor([[-1.0, -2.0, -0.5], [-1.5, -0.7, -3.0]], requires_grad=True)
    mask = torch.tensor([[False, True, True], [False, True, False]])  # prompt / tool tokens are False
    loss, stats = ggpo_loss(lp, lp.detach() - 0.1, lp.detach() + 0.05, torch.tensor([1.0, -1.0]), mask, cfg)
    loss.backward()
    assert stats.loss_tokens == 3 and stats.nonzero_advantage_tokens == 3
    assert lp.grad is not None
    assert (lp.grad[~mask] == 0).all() and (lp.grad[mask] != 0).all()


def test_ratio_is_clipped_in_the_direction_of_the_advantage() -> None:
    cfg = GgpoConfig(group_size=2, clip_epsilon=0.2, kl_coef=0.0)
    behaviour = torch.log(torch.tensor([[0.5]]))
    lp = torch.log(torch.tensor([[0.9]])).requires_grad_()  # ratio 1.8 > 1.2
    loss, stats = ggpo_loss(lp, behaviour, lp.detach(), torch.tensor([1.0]), torch.tensor([[True]]), cfg)
    loss.backward()
    assert float(loss) == pytest.approx(-1.2)
    assert float(lp.grad) == 0.0 and stats.clip_fraction == 1.0


def test_importance_weights_truncate_at_the_cap_and_scale_the_policy_term_only() -> None:
    """old_logprobs = "rollout": w = min(exp(policy_old - rollout), C) per token (TRL's token_truncate),
    1 outside the mask, no gradient; it multiplies the clipped policy term, not the KL term."""
    cap = 2.0
    policy_old = torch.tensor([[-1.0, -1.0, -1.0, -5.0]])
    rollout = torch.tensor([[-1.0, -1.5, -3.0, -1e4]])  # the last: a padding sentinel outside the mask
    mask = torch.tensor([[True, True, True, False]])
    w = truncated_is_weights(policy_old.requires_grad_(), rollout, mask, cap)
    assert not w.requires_grad
    assert w[0].tolist() == pytest.approx([1.0, float(torch.exp(torch.tensor(0.5))), cap, 1.0])  # e^2 > C: truncated
    cfg = GgpoConfig(group_size=2, clip_epsilon=0.2, kl_coef=0.5)
    lp = policy_old.detach().clone().requires_grad_()
    ref = lp.detach() - 0.3
    adv = torch.tensor([1.5])
    plain, stats = ggpo_loss(lp, lp.detach(), ref, adv, mask, cfg)
    weighted, _ = ggpo_loss(lp, lp.detach(), ref, adv, mask, cfg, is_weights=w)
    kl = float(torch.exp(torch.tensor(-0.3)) + 0.3 - 1.0)
    # ratio 1 at the update (old = the policy's own): policy term -A per token, weighted by w
    assert float(plain) == pytest.approx(-1.5 + 0.5 * kl, abs=1e-6) and stats.clip_fraction == 0.0
    assert float(weighted) == pytest.approx(-1.5 * float(w[0, :3].mean()) + 0.5 * kl, abs=1e-6)
    (grad,) = torch.autograd.grad(weighted, lp)
    assert grad[0, 3] == 0 and grad[0, 2] < grad[0, 1] < grad[0, 0] < 0  # larger weight, larger push
    with pytest.raises(ValueError, match="is_weights"):
        ggpo_loss(lp, lp.detach(), ref, adv, mask, cfg, is_weights=w[:, :2])


def test_padding_sentinels_give_finite_loss_and_zero_gradient() -> None:
    cfg = GgpoConfig(group_size=2)
    lp = torch.tensor([[-1.0, 0.0]], requires_grad=True)
    loss, _ = ggpo_loss(lp, torch.tensor([[-1.0, -1e4]]), torch.tensor([[-1.0, 1e4]]), torch.tensor([2.0]),
                        torch.tensor([[True, False]]), cfg)
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(lp.grad).all() and float(lp.grad[0, 1]) == 0.0


def test_token_logprobs_and_bad_shapes() -> None:
    logits = torch.tensor([[[0.0, 0.0], [2.0, 0.0]]])
    out = token_logprobs(logits, torch.tensor([[1, 0]]))
    assert out[0, 0].item() == pytest.approx(torch.log(torch.tensor(0.5)).item())
    with pytest.raises(ValueError, match="groups, G>=2"):
        group_advantages(torch.ones(3))
    with pytest.raises(ValueError, match="group_size"):
        GgpoConfig(group_size=1)
