"""The ggpo loss is TRL's GRPO loss (trl==1.16.0, the dev extra) on one identical batch, to 1e-5.

The TRL options that correspond to ggpo (ggpo_batch/train/policy/ggpo.py):
  loss_type="bnpo"               the token-level mean over the (rank's) batch: sum(per-token loss x mask) /
                                 sum(mask); "grpo" would average per sequence first, "dr_grpo" divide by
                                 rows x max_completion_length, "dapo" by the tokens of the global batch
  epsilon = epsilon_high         the symmetric clip, clip(rho, 1 - eps, 1 + eps) (clip_epsilon)
  delta=None                     no two-sided clipping of rho
  importance_sampling_level="token"   rho per token, against old_per_token_logps (our behaviour log-probs)
  beta (kl_coef)                 beta x k3: exp(ref - logp) - (ref - logp) - 1
  use_bias_correction_kl=False   TRL 1.16 defaults to multiplying the KL term by rho; ggpo does not
  top_entropy_quantile=1.0, off_policy_mask_threshold=None
  vllm_importance_sampling_correction, mode "token_truncate", clip_max C: `[train] old_logprobs =
                                 "rollout"` with rollout_is_cap C (TRL's "old" log-probs are then the
                                 policy's own, its vLLM log-probs only enter the truncated weight); the
                                 default old_logprobs = "policy" is TRL without that correction
  tool_mask                      TRL's mask of tool-output tokens inside a completion: ggpo's loss mask
                                 (prompt, tool output and padding carry no loss)
  temperature                    both divide the logits by it before the log-softmax
Advantages are given (TRL would compute its own, with scale_rewards="group": the group's unbiased std
+ 1e-4; ggpo uses the population std + advantage_eps and drops all-equal groups).
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
trl = pytest.importorskip("trl")
pytest.importorskip("datasets")
pytestmark = [pytest.mark.train, pytest.mark.slow]  # TRL's trainer set up beside ours: 7 s

from ggpo_batch.train.ggpo_config import GgpoConfig
from ggpo_batch.train.policy.ggpo import ggpo_loss, truncated_is_weights
from ggpo_batch.train.policy.model import policy_token_logprobs

G, EPS, BETA, TEMPERATURE, CAP = 4, 0.2, 0.05, 0.9, 1.2


@pytest.mark.parametrize("importance_sampling", [False, True])
def test_ggpo_loss_equals_trl_grpo_loss_on_one_batch(tmp_path, tiny_hf, importance_sampling):  # type: ignore[no-untyped-def]
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    from ggpo_batch.train.pretrained.hf import load_tokenizer
    from ggpo_batch.train.task.codec import HfCodec

    codec = HfCodec(load_tokenizer(tiny_hf), max_model_len=1024)
    args = GRPOConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, report_to="none", loss_type="bnpo",
                      beta=BETA, epsilon=EPS, epsilon_high=EPS, delta=None, importance_sampling_level="token",
                      use_bias_correction_kl=False, top_entropy_quantile=1.0, temperature=TEMPERATURE,
                      num_generations=G, per_device_train_batch_size=G, max_completion_length=32, use_vllm=False,
                      save_strategy="no", disable_tqdm=True)
    trainer = GRPOTrainer(model=str(tiny_hf), reward_funcs=lambda completions, **_: [0.0] * len(completions),
                          args=args, train_dataset=Dataset.from_list([{"prompt": "Where?"}] * G),
                          processing_class=codec.tokenizer)
    model = trainer.model
    model.train()
    trainer.current_gradient_accumulation_steps = 1

    # One group: a shared chat prompt; completions = a search call, tool output, an answer, padding.
    g = torch.Generator().manual_seed(0)
    prompt = codec.chat_prompt("Q: Where was the founder of Kazo born?\nA:")
    rows, tool_rows = [], []
    for i in range(G):
        call = torch.randint(0, 500, (3 + i,), generator=g).tolist()
        tool = torch.randint(0, 500, (5,), generator=g).tolist()
        answer = torch.randint(0, 500, (4 + 2 * i,), generator=g).tolist()
        rows.append(call + tool + answer)
        tool_rows.append([1] * len(call) + [0] * len(tool) + [1] * len(answer))
    width = max(map(len, rows))
    completion = torch.full((G, width), codec.pad_id)
    completion_mask, tool_mask = torch.zeros(G, width, dtype=torch.long), torch.zeros(G, width, dtype=torch.long)
    for i, (r, t) in enumerate(zip(rows, tool_rows)):
        completion[i, : len(r)], completion_mask[i, : len(r)], tool_mask[i, : len(r)] = torch.tensor(r), 1, torch.tensor(t)
    prompt_ids = torch.tensor([prompt] * G)
    ids = torch.cat([prompt_ids, completion], dim=1)
    attn = torch.cat([torch.ones_like(prompt_ids), completion_mask], dim=1)
    mask = (completion_mask * tool_mask).bool()

    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=attn).logits[:, :-1]
        current = policy_token_logprobs(logits, ids[:, 1:], TEMPERATURE, codec)[:, len(prompt) - 1:]
    # Behaviour and reference log-probs off the current ones: ratios on both sides of the clip range.
    behaviour = torch.where(mask, current + 0.3 * torch.randn(current.shape, generator=g), 0.0)
    reference = torch.where(mask, current + 0.5 * torch.randn(current.shape, generator=g), 0.0)
    advantages = torch.tensor([1.2, -0.4, 0.9, -1.7])

    inputs = {"prompt_ids": prompt_ids, "prompt_mask": torch.ones_like(prompt_ids), "completion_ids": completion,
              "completion_mask": completion_mask, "tool_mask": tool_mask, "advantages": advantages,
              "old_per_token_logps": behaviour, "ref_per_token_logps": reference}
    weights = None
    if importance_sampling:  # `behaviour` is then the engine's: TRL's own recompute is the current policy
        trainer.use_vllm = trainer.vllm_importance_sampling_correction = True
        trainer.vllm_importance_sampling_mode = "token_truncate"
        trainer.vllm_importance_sampling_clip_max = CAP
        # TRL's ratio as _generate_and_score_completions builds it (token_truncate, clip_min None)
        trl_ratio = torch.clamp(torch.exp((current - behaviour) * mask), min=None, max=CAP)
        inputs.update(old_per_token_logps=current, sampling_per_token_logps=behaviour,
                      importance_sampling_ratio=trl_ratio)
        weights = truncated_is_weights(current, behaviour, mask, CAP)
        assert torch.allclose(weights, trl_ratio) and bool((weights == CAP).any()) and bool((weights < 1).any())
    model.zero_grad()
    trl_loss = trainer._compute_loss(model, inputs)
    trl_loss.backward()
    trl_grads = [p.grad.detach().clone() for p in model.parameters()]

    model.zero_grad()
    logits = model(input_ids=ids, attention_mask=attn).logits[:, :-1]
    logp = policy_token_logprobs(logits, ids[:, 1:], TEMPERATURE, codec)[:, len(prompt) - 1:]
    old = current if importance_sampling else behaviour
    ours, stats = ggpo_loss(logp, old, reference, advantages, mask,
                            GgpoConfig(group_size=G, clip_epsilon=EPS, kl_coef=BETA), is_weights=weights)
    ours.backward()
    assert stats.loss_tokens == int(mask.sum())
    if not importance_sampling:
        assert 0 < stats.clip_fraction < 1  # the clip is exercised
    assert float(ours.detach()) == pytest.approx(float(trl_loss.detach()), abs=1e-5)
    for ours_g, trl_g in zip((p.grad for p in model.parameters()), trl_grads):
        assert torch.allclose(ours_g, trl_g, atol=1e-5, rtol=1e-4)
