"""The ggpo method at tier l1_mechanism, one seed: the training job's own ggpo update
(`ggpo_batch.train.policy.ggpo`, imported, never copied) on a BytePolicy trained from scratch.

Stages, all with fixed budgets: a teacher learns next-byte NLL from scratch on the train bytes
(`teacher_steps`), then is frozen; a specialist continues from it (`specialist_steps`), then is
frozen; the student starts from the specialist and takes `student_steps` ggpo updates on groups
sampled online from a behaviour copy re-synced after each update, against a reference refreshed
every `reference_refresh_steps`. Reward: the first sampled byte ID is even (a verifier that tests
the mechanism, not text quality). Frozen models are measured afterwards to prove they stayed frozen.
"""

from __future__ import annotations

import copy
import logging
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ..train.policy.ggpo import ggpo_loss, group_advantages, token_logprobs
from .corpus import ByteSplit
from .policy import (
    EOS,
    BytePolicy,
    PolicyConfig,
    flat_parameters,
    nll,
    parameter_delta_l2,
    sample,
)
from .suite import Budgets, GgpoTierConfig

log = logging.getLogger(__name__)

REWARD = "first sampled byte ID is even; verifier mechanism diagnostic, not text quality"
BRANCH = "direct_autograd"  # the loss gradient comes from autograd through ggpo_loss, no custom backward


def first_byte_even(tokens: torch.Tensor) -> torch.Tensor:
    """Reward per rollout [G]: 1.0 when the first generated token is a byte with an even ID (EOS is not a byte)."""
    first = tokens[:, 0]
    return ((first != EOS) & (first % 2 == 0)).to(torch.float32)


@dataclass(frozen=True)
class SeedOutcome:
    """The seed's `per_seed` record entry and the raw facts the execution checks are computed from."""

    entry: dict[str, Any]
    heldout_bytes_trained: int
    windows_served: int
    behaviour_matched_student_at_sampling: bool
    student_sampled_tokens: int
    teacher_sampled_tokens: int
    device: str  # where the student's parameters lived (the record's accelerator)


def _fit_nll(model: BytePolicy, split: ByteSplit, steps: int, budgets: Budgets, gen: torch.Generator) -> None:
    opt = torch.optim.Adam(model.parameters(), lr=budgets.learning_rate)
    for _ in range(steps):
        batch = split.train_windows(gen, budgets.batch_size, budgets.window_bytes)
        logits = model(batch[:, :-1])
        loss = nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()


def _frozen_copy(model: BytePolicy) -> BytePolicy:
    twin = copy.deepcopy(model)
    twin.requires_grad_(False)
    return twin


def _shares_storage(a: nn.Module, b: nn.Module) -> bool:
    ptrs = {p.data_ptr() for p in a.parameters()}
    return any(p.data_ptr() in ptrs for p in b.parameters())


def _num(x: float) -> float | int:
    return int(x) if float(x).is_integer() else float(x)


def run_seed(seed: int, split: ByteSplit, budgets: Budgets, gcfg: GgpoTierConfig, width: int) -> SeedOutcome:
    """Run the whole ggpo mechanism for one seed; deterministic given (seed, corpus, config)."""
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    served_before = len(split.served)
    config = gcfg.ggpo
    val = split.heldout_chunks("validation", budgets.eval_chunk_bytes)
    test = split.heldout_chunks("test", budgets.eval_chunk_bytes)

    teacher = BytePolicy(PolicyConfig(width=width))
    _fit_nll(teacher, split, budgets.teacher_steps, budgets, gen)
    teacher.requires_grad_(False)
    specialist = copy.deepcopy(teacher).requires_grad_(True)
    specialist.sampled_tokens = 0  # the counter is not a weight: a copy's own sampling counts from zero
    _fit_nll(specialist, split, budgets.specialist_steps, budgets, gen)
    specialist.requires_grad_(False)
    frozen = [(teacher, flat_parameters(teacher)), (specialist, flat_parameters(specialist))]

    student = copy.deepcopy(specialist).requires_grad_(True)
    student.sampled_tokens = 0  # so the teacher's sampling, if any, is never booked as the student's
    behaviour, reference = _frozen_copy(student), _frozen_copy(student)
    start = flat_parameters(student)
    snapshots = [(_frozen_copy(student), start)]
    baseline_val = nll(student, val)
    opt = torch.optim.Adam(student.parameters(), lr=budgets.student_learning_rate)

    history: list[dict[str, Any]] = []
    generated = natural = rejected = refreshes = syncs = 0
    online = True
    for step in range(budgets.student_steps):
        online &= parameter_delta_l2(behaviour, flat_parameters(student)) == 0.0
        for _draw in range(gcfg.max_group_draws_per_step):
            prompt = split.train_windows(gen, 1, budgets.prompt_bytes)[0]
            rollouts = sample(behaviour, prompt, gcfg.group_size, budgets.max_new_tokens, gen)
            generated += rollouts.generated_tokens
            natural += int(rollouts.natural_eos.sum().item())
            adv = group_advantages(first_byte_even(rollouts.tokens)[None, :], eps=config.advantage_eps)
            rejected += adv.rejected_groups
            if adv.retained_groups:
                break
        p = prompt.shape[0]
        seqs = torch.cat([prompt[None, :].repeat(gcfg.group_size, 1), rollouts.tokens], dim=1)
        inputs = seqs[:, :-1]
        mask = torch.arange(budgets.max_new_tokens)[None, :] < rollouts.lengths[:, None]
        logprobs = token_logprobs(student(inputs)[:, p - 1:], rollouts.tokens)
        with torch.no_grad():
            behaviour_lp = token_logprobs(behaviour(inputs)[:, p - 1:], rollouts.tokens)
            reference_lp = token_logprobs(reference(inputs)[:, p - 1:], rollouts.tokens)
        loss, _stats = ggpo_loss(logprobs, behaviour_lp, reference_lp, adv.advantages[0], mask, config)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(student.parameters(), float("inf"))
        opt.step()
        refreshed = (step + 1) % config.reference_refresh_steps == 0
        if refreshed:
            reference.load_state_dict(student.state_dict())
            refreshes += 1
        if step + 1 < budgets.student_steps:
            behaviour.load_state_dict(student.state_dict())
            syncs += 1
        if step + 1 == budgets.student_steps // 2 and step + 1 < budgets.student_steps:
            snapshots.append((_frozen_copy(student), flat_parameters(student)))
        history.append({
            "step": step,
            "loss": float(loss.item()),
            "gradient_norm": float(grad_norm.item()),
            "retained_groups": adv.retained_groups,
            "raw_gap": adv.raw_gap,
            "mean_length": _num(float(rollouts.lengths.float().mean().item())),
            "branch": BRANCH,
            "reference_refreshed": refreshed,
        })
    snapshots.append((_frozen_copy(student), flat_parameters(student)))
    entry = {
        "seed": seed,
        "parameter_delta_l2": parameter_delta_l2(student, start),
        "baseline_validation_nll": baseline_val,
        "final_validation_nll": nll(student, val),
        "final_test_nll": nll(student, test),
        "generated_tokens": generated,
        "natural_eos_rollouts": natural,
        "rejected_diagnostic_groups": rejected,
        "history": history,
        "reference_refreshes": refreshes,
        "behavior_syncs": syncs,
        "behavior_is_reference": _shares_storage(behaviour, reference),
        "reward": REWARD,
        "frozen_teacher_parameter_deltas_l2": [_num(parameter_delta_l2(m, v)) for m, v in frozen],
        "frozen_rl_snapshot_parameter_deltas_l2": [_num(parameter_delta_l2(m, v)) for m, v in snapshots],
    }
    log.info("ggpo seed %d: delta %.3g, val nll %.4f -> %.4f", seed, entry["parameter_delta_l2"],
             baseline_val, entry["final_validation_nll"])
    return SeedOutcome(
        entry=entry,
        heldout_bytes_trained=split.heldout_bytes_touched_by_training(since=served_before),
        windows_served=len(split.served) - served_before,
        behaviour_matched_student_at_sampling=bool(online),
        student_sampled_tokens=behaviour.sampled_tokens,
        teacher_sampled_tokens=teacher.sampled_tokens + specialist.sampled_tokens,
        device=next(student.parameters()).device.type,
    )
