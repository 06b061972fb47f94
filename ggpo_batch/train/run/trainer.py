"""The ggpo trainer: one run on one allocation, readable top to bottom.

setup -> loop (rollouts, advantages, update, weight sync) until loop_seconds >= budget, finishing
the batch in flight -> export -> audit -> evaluation. Every rank runs this; ranks split the step's
groups, DeepSpeed averages gradients, and counts are summed across ranks at the end.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import logging
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from ...contracts.run_record import AUX_COST_KEYS, AUX_SOURCE_KEYS, COST_KEYS, COUNT_KEYS
from ...contracts.runspec import RunSpec
from ..audit.audit import AuditResult, StepEvidence, audit
from ..audit.checkpoint import LoopState
from ..config import TrainConfig
from ..policy.answer_loss import answer_examples, answer_loss
from ..policy.batch import agreed_plan, loss_batch, pass_inputs, step_signal
from ..policy.deepspeed_import import import_deepspeed
from ..policy.engine_config import policy_engine_config
from ..policy.ggpo import ggpo_loss, group_advantages, truncated_is_weights
from ..policy.logprobs import Chunks, masked_logprobs
from ..policy.model import initial_policy, named_full_parameters, update_digest
from ..policy.passes import FILLER, Pass, token_budget
from ..policy.reference import Reference
from ..policy.step_figures import StepFigures
from ..rollout.backends import make_backend
from ..rollout.engine_size import engine_size
from .evaluation import eval_items
from ..rollout.continuous import run_episodes
from ..rollout.environment import Trajectory, start
from ..rollout.memory_order import free_cached_blocks, update_then_refill
from ..task.codec import Codec, make_codec
from ..task.curriculum import Curriculum, GroupSpec
from ..task.qa import load
from ..task.retrieval import Retriever
from ..task.rewards import Rewards
from .weight_sync import WeightSync, probe_sequence

log = logging.getLogger(__name__)

# The record's counters the loop tallies (rank-summed at the end); `steps` is the loop's own.
COUNTS = tuple(k for k in COUNT_KEYS if k != "steps")
COSTS = COST_KEYS + AUX_COST_KEYS
AUX = AUX_SOURCE_KEYS
PROBE_ITEMS = 8  # training items whose prompt and answer make the weight-sync probe's sequence


class Trainer:
    def __init__(self, spec: RunSpec, cfg: TrainConfig, *, rank: int, world: int, device: torch.device,
                 budget_seconds: float) -> None:
        deepspeed = import_deepspeed(device.type == "cuda")

        self.spec, self.cfg, self.rank, self.world, self.device = spec, cfg, rank, world, device
        self.budget_seconds = budget_seconds
        self.gcfg = cfg.ggpo
        self.data = load(cfg)
        self.retriever = Retriever(self.data.corpus)
        self.rewards = Rewards(cfg.task)  # `[train.task] reward`: a user's file is imported here, once per rank
        self.curriculum = Curriculum(spec.arm, self.data, group_size=cfg.group_size,
                                     prompts_per_step=cfg.prompts_per_step,
                                     exposures_per_step=cfg.exposures_per_step, seed=spec.seed)
        # A pretrained checkpoint: resolved once (a hub id from the local cache), read offline.
        self.model_dir = None
        if cfg.model is not None:
            from ..pretrained.hf import resolve

            self.model_dir = resolve(cfg.model.path)
        self.codec: Codec = make_codec(cfg, str(self.model_dir) if self.model_dir else None)
        if cfg.model is not None:
            bf16, fp16 = cfg.model.dtype == "bfloat16", cfg.model.dtype == "float16"
        else:
            bf16, fp16 = cfg.precision == "bf16" or (cfg.precision == "auto" and device.type == "cuda"), False
        model = initial_policy(cfg, spec.seed, self.model_dir)
        # Partitioned like the policy under ZeRO-3 (train/reference.py): never a whole copy per rank.
        self.reference = Reference(copy.deepcopy(model), zero_stage=cfg.zero_stage, device=device, bf16=bf16,
                                   fp16=fp16)
        self.chunks = Chunks(cfg.logprob_chunk_tokens, cfg.logprob_chunk_vocab)
        # Torch rollouts sample from the policy module itself: no behaviour copy to push weights into
        # after each update. Under ZeRO-2 every rank holds the whole weights; under ZeRO-3 they are
        # gathered for the rollouts only (`_generation_weights`). vLLM serves its own copy.
        self.shares_policy = cfg.rollout == "torch"
        behaviour = (copy.deepcopy(model).to(device).requires_grad_(False).eval()
                     if cfg.rollout == "torch" and not self.shares_policy else model)
        self.token_budget = token_budget(cfg, world)
        # One pass to start with: each step sets the gradient accumulation to its own number of passes (`_update`).
        ds_config = policy_engine_config(model, zero_stage=cfg.zero_stage, passes=1, grad_clip=cfg.grad_clip,
                                         lr=cfg.lr, bf16=bf16, fp16=fp16, gpu=device.type == "cuda")
        self.engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=ds_config)
        vllm_options = {"gpu_memory_utilization": cfg.vllm_gpu_memory_utilization, "seed": spec.seed,
                        "device_index": device.index, "model_dir": self.model_dir,
                        "max_model_len": cfg.max_model_len,
                        "dtype": cfg.model.dtype if cfg.model is not None else "bfloat16",
                        "enforce_eager": cfg.vllm_enforce_eager,
                        "size": engine_size(prompts_per_step=cfg.prompts_per_step, group_size=cfg.group_size,
                                            eval_items=len(eval_items(self.data.heldout, cfg.eval_size)),
                                            eval_samples=cfg.eval_samples, world=world,
                                            tensor_parallel_size=cfg.tensor_parallel_size)}
        self.backend = make_backend(cfg.rollout, self.engine.module if self.shares_policy else behaviour, self.codec,
                                    **vllm_options, tensor_parallel_size=cfg.tensor_parallel_size)
        # Each push into a behaviour copy is checked by a log-prob probe (train/weight_sync.py).
        self.weight_sync = None if self.shares_policy else WeightSync(
            self.engine.module, cfg.zero_stage, self.backend, probe_sequence(self.codec, self.data.train[:PROBE_ITEMS]),
            "bfloat16" if bf16 else "float16" if fp16 else "float32", device)
        self.free_cache = free_cached_blocks(device)
        self.state = LoopState()
        self.evidence: list[StepEvidence] = []

    # ---- one step -------------------------------------------------------------------------------
    def _rollouts(self, groups: list[GroupSpec], step: int) -> list[list[Trajectory]]:
        G = self.cfg.group_size
        trajs: list[list[Trajectory]] = []
        for gi, g in enumerate(groups):
            per = G // len(g.parts)
            first = (self.rank + gi * self.world) * G  # ids by the group's place in the step, not the rank's share
            group: list[Trajectory] = []
            for item, tmpl in g.parts:
                prompt = self.codec.prompt(tmpl, item)  # start() copies it for each trajectory
                group += [start(item, tmpl, prompt, uid=first + len(group) + j) for j in range(per)]
            trajs.append(group)
        flat = [t for ts in trajs for t in ts]
        with self._generation_weights():
            run_episodes(flat, self.backend, self.retriever, max_turns=self.cfg.max_turns,
                         max_new_tokens=self.cfg.max_new_tokens, temperature=self.cfg.temperature,
                         top_k=self.cfg.retrieval_top_k, passage_max_bytes=self.cfg.passage_max_bytes,
                         seed=self.spec.seed, step=step, codec=self.codec, rewards=self.rewards)
        return trajs

    def _aux_examples(self, groups: list[GroupSpec], trajs: list[list[Trajectory]]) -> list[tuple[list[int], int]]:
        """Supervised (tokens, answer_start) targets for exposed items whose gold answer is verified."""
        return answer_examples(self.state, self.retriever, self.codec, self.cfg.retrieval_top_k, groups, trajs)

    def _aux_loss(self, examples: list[tuple[list[int], int]]) -> torch.Tensor | None:
        return answer_loss(self.engine, self.codec, self.chunks, self.device, self.state.tally, examples)

    def step(self) -> bool:
        """One batch: rollouts, advantages, one update. Returns True when the loop must stop."""
        st, cfg = self.state, self.cfg
        t0 = time.perf_counter()
        groups = self.curriculum.step_groups(st.step)[self.rank :: self.world]
        trajs = self._rollouts(groups, st.step)
        rewards = torch.tensor([[t.reward for t in ts] for ts in trajs], dtype=torch.float32)
        adv = group_advantages(rewards, self.gcfg.advantage_eps)
        self._tally_rollouts(groups, trajs, adv)
        aux = self._aux_examples(groups, trajs) if self.spec.arm.auxiliary_answer_loss else []
        batch, row_adv, evidence = loss_batch(st.step, self.rank, trajs, rewards, adv, self.gcfg.advantage_eps,
                                              self.codec.pad_id)
        self.evidence.append(evidence)
        passes = self._plan(batch[1])
        figures = StepFigures.local(rewards, adv, trajs, len(groups))
        # What the update computes: each pass's rows padded to the pass's own longest. A zero-mask
        # stand-in row (this rank kept no group) is no cost of the loss: its passes count as fillers.
        stand_in = evidence.row_trajectories == [None]
        tokens = 0 if stand_in else int(batch[1].sum())
        padded = figures.add_passes([FILLER] * len(passes) if stand_in else passes, tokens)
        st.tally["rl_sequence_nonpadding_tokens"] += tokens
        st.tally["rl_sequence_padded_tokens"] += padded
        ended: list[float] = []

        def update() -> None:
            self._update(batch, row_adv, aux, figures, passes)
            figures.reduce(self.device, time.perf_counter() - t0)  # the step's loop time ends here
            ended.append(time.perf_counter())

        # Sleep, train, free torch's cache, wake the engine's weights, push, wake its KV cache
        # (train/memory_order.py); the post-update sync is outside the loop budget (seed BUDGET_LIMITATION).
        update_then_refill(self.backend, update, self.weight_sync.load if self.weight_sync is not None else None,
                           self.free_cache)
        sync_seconds = time.perf_counter() - ended[0] if self.weight_sync is not None else None
        probe = self.weight_sync.probe(st.step) if self.weight_sync is not None else None
        st.loop_seconds += figures.step_seconds
        st.last_batch_seconds = figures.step_seconds
        st.history.append(figures.history_entry(
            st.step, world=self.world, branch=f"deepspeed_zero{cfg.zero_stage}", loop_seconds=st.loop_seconds,
            weight_sync_seconds=sync_seconds, probe=probe.as_dict() if probe is not None else None))
        st.step += 1
        if self.rank == 0:
            log.info("step %d loss %.4f retained %d loop %.2fs", st.step, st.history[-1]["loss"],
                     st.history[-1]["retained_groups"], st.loop_seconds)
        return self.loop_done()

    def _tally_rollouts(self, groups: list[GroupSpec], trajs: list[list[Trajectory]], adv: Any) -> None:
        st, tally = self.state, self.state.tally
        for gi, (g, ts) in enumerate(zip(groups, trajs)):
            keep = bool(adv.retained[gi])
            for t in ts:
                tally["trajectories"] += 1
                tally["retrieved_trajectories"] += int(t.retrieved)
                tally["backend_calls"] += t.calls
                tally["backend_generated_tokens"] += t.generated_tokens
                tally["backend_requested_input_tokens"] += t.input_tokens
            if g.shared:
                tally["shared_groups"] += 1
                tally["shared_trajectories"] += len(ts)
            if g.exposure:
                for _, tmpl in g.parts:
                    st.templates[tmpl] += 1
                tally["actual_exposed"] += len(g.parts)
                tally["exposed_with_nonzero_advantage"] += len(g.parts) * int(keep)
                st.exposed_items.update(item.item_id for item, _ in g.parts)

    def _plan(self, attn: torch.Tensor) -> list[Pass]:
        """The step's passes on this rank (collective): its rows packed to the token budget and
        train.micro_batch_size, as many passes as the rank that needs the most (batch.agreed_plan)."""
        return agreed_plan(attn.sum(dim=1).tolist(), self.token_budget, self.cfg.micro_batch_size, self.device)

    def _passes(self, ids: torch.Tensor, attn: torch.Tensor, mask: torch.Tensor,
                passes: list[Pass]) -> Iterator[tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]]:
        """The rank's rows in the step's passes: (row indices, ids, attention, loss mask) each."""
        for p in passes:
            yield pass_inputs(ids, attn, mask, p)

    def _policy_logprobs(self, part_ids: torch.Tensor, part_attn: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
        return masked_logprobs(self.engine, self.engine.module, part_ids, part_attn, m, self.cfg.temperature,
                               self.codec, self.chunks)

    def _old_logprobs(self, logp: torch.Tensor) -> torch.Tensor:
        """PPO's "old" log-probs of a pass, both `[train] old_logprobs` choices: the update's own forward
        (`logp`), detached. Exact, not an approximation: the optimizer steps once per batch, after the
        last pass (`_update`; no config asks for several epochs or minibatches of a batch), so every
        pass's forward runs the weights from before the update, and the ratio is exactly 1 (PPO's
        first epoch). A second no-grad forward of every pass (verl's recompute) would give the same
        numbers for one more forward a pass; only a batch trained over several optimizer steps needs it."""
        return logp.detach()

    def _update(self, batch: tuple[torch.Tensor, ...], row_adv: list[float],
                aux: list[tuple[list[int], int]], figures: StepFigures, plan: list[Pass]) -> None:
        """The step's one optimizer update over the rank's rows in the step's packed forward/backward
        passes (`_plan`; DeepSpeed accumulates them in float32; the optimizer steps after the last). The
        loss is the token mean over the whole step, every rank's tokens: each part is its tokens' sum
        over the step's count (`step_signal`), times the ranks, since DeepSpeed averages the ranks'
        gradients; so the parts of every rank sum to the loss of one pass over all the step's rows,
        whatever each rank kept. A step with no signal on any rank (no loss token, no auxiliary
        example) runs no pass and skips the optimizer: the weights, and Adam's state, stay as they were."""
        cfg, tally = self.cfg, self.state.tally
        ids, attn, mask, blp = (t.to(self.device) for t in batch)
        adv_t, blp = torch.tensor(row_adv, device=self.device), blp[:, 1:]
        total, aux_examples = step_signal(mask, len(aux), self.device)
        figures.reference_refreshed = (self.state.step + 1) % self.gcfg.reference_refresh_steps == 0
        if not total and not aux_examples:
            log.info("step %d: no signal on any rank (every group dropped): the optimizer does not step",
                     self.state.step)
            figures.gradient_norm = None
            if figures.reference_refreshed:
                self.reference.refresh(self.engine.module)
            return
        scale = self.world / total if total else 0.0
        ref = self.reference
        passes = list(self._passes(ids, attn, mask, plan))
        # Gradient accumulation over this step's passes: the count (what DeepSpeed's bookkeeping reads)
        # and the boundary set pass by pass, so the optimizer steps after the last whatever the
        # engine's micro-step counter says after steps of other counts.
        self.engine.set_train_batch_size(len(passes) * self.world)
        for j, (rows, part_ids, part_attn, m) in enumerate(passes):
            # Log-probs of the masked targets only, in chunks (train/logprobs.py), 0 elsewhere: targets
            # outside the mask may be tool delimiters, impossible (-inf) under the policy.
            logp = self._policy_logprobs(part_ids, part_attn, m)
            with torch.no_grad():
                ref_logp = masked_logprobs(ref.call, ref.module, part_ids, part_attn, m, cfg.temperature, self.codec,
                                           self.chunks)
            rollout = blp[rows, : m.shape[1]]
            policy_old = self._old_logprobs(logp)
            weights = (truncated_is_weights(policy_old, rollout, m, cfg.rollout_is_cap)
                       if cfg.old_logprobs == "rollout" else None)
            part, stats = ggpo_loss(logp, policy_old, ref_logp, adv_t[rows], m, self.gcfg, is_weights=weights)
            figures.add_pass(stats, rollout, policy_old, m, weights, cfg.rollout_is_cap)
            part = part * (m.sum() * scale)
            tally["rl_loss_tokens"] += stats.loss_tokens
            tally["nonzero_advantage_tokens"] += stats.nonzero_advantage_tokens
            if j == len(passes) - 1 and self.spec.arm.auxiliary_answer_loss:
                aux_loss = self._aux_loss(aux)
                if aux_loss is not None:
                    part = part + cfg.aux_coef * aux_loss
            self.engine.set_gradient_accumulation_boundary(j == len(passes) - 1)
            self.engine.backward(part, scale_wrt_gas=False)
            self.engine.step()
            figures.loss += float(part.detach())
        grad_norm = self.engine.get_global_grad_norm()
        figures.gradient_norm = float(grad_norm) if grad_norm is not None else None
        if figures.reference_refreshed:
            self.reference.refresh(self.engine.module)

    # ---- phases after the loop ------------------------------------------------------------------
    def run_audit(self) -> AuditResult:
        """Every rank audits its own evidence; every rank returns the whole run's: counts summed over
        ranks (steps are shared: their count is the fewest any rank checked) and every rank's problems."""
        mine = audit(self.evidence, self.codec, self.weight_sync.log if self.weight_sync is not None else None,
                     rewards=self.rewards)
        for p in mine.problems:
            log.error("audit (rank %d): %s", self.rank, p)
        per_rank: list[Any] = [None] * self.world
        dist.all_gather_object(per_rank, mine)
        res = AuditResult(steps_checked=min(r.steps_checked for r in per_rank))
        for rank, r in enumerate(per_rank):
            res.trajectories_checked += r.trajectories_checked
            res.rows_checked += r.rows_checked
            res.generated_tokens_checked += r.generated_tokens_checked
            res.problems += [f"rank {rank}: {p}" for p in r.problems]
            res.probes += r.probes
            res.rollouts += r.rollouts
            if not r.steps_checked:
                res.problems.append(f"rank {rank}: no step to audit")
        return res

    def evaluate(self) -> dict[str, Any]:
        """The held-out evaluation (train/evaluation.py): per-item rewards, split by exposure in this arm;
        collective: every rank calls it, every rank returns the whole run's."""
        from .evaluation import evaluate_items

        cfg = self.cfg
        items = eval_items(self.data.heldout, cfg.eval_size)
        # Exposed = trained on in an exposure group before the budget ended, on any rank (not planned).
        per_rank: list[Any] = [None] * self.world
        dist.all_gather_object(per_rank, sorted(self.state.exposed_items))
        exposed = set().union(*per_rank)
        planned = {it.item_id for g in self.curriculum.exposure_groups for it, _ in g.parts}
        with self._generation_weights():
            return evaluate_items(cfg, self.codec, self.backend, self.retriever, items, exposed,
                                  planned=len(planned), rank=self.rank, world=self.world, seed=self.spec.seed,
                                  rewards=self.rewards)

    @contextlib.contextmanager
    def _generation_weights(self) -> Iterator[None]:
        """The policy's whole weights while the torch sampler generates from it. Under ZeRO-3 DeepSpeed's
        `unwrap_model_for_generation` gathers them once for the phase with its hooks off (per-layer
        gathers for every token would crawl) and re-partitions them after: the full weights exist only
        while rolling out, never beside the update's activations."""
        if self.cfg.zero_stage < 3 or self.cfg.rollout != "torch":
            yield
            return
        from deepspeed.runtime.zero.stage3 import unwrap_model_for_generation

        with unwrap_model_for_generation(self.engine):
            yield

    def totals(self) -> dict[str, int]:
        """Counts, costs and aux sources summed over ranks."""
        keys = COUNTS + COSTS + AUX
        vec = torch.tensor([self.state.tally[k] for k in keys], dtype=torch.float64, device=self.device)
        dist.all_reduce(vec, op=dist.ReduceOp.SUM)
        return {k: int(v) for k, v in zip(keys, vec.tolist())}

    def reward_counts(self) -> dict[str, int]:
        """The rewards' own counts (`math_unparsed`: completions math-verify could not parse in its time,
        scored 0), summed over ranks; collective."""
        mine = self.rewards.counts()
        if not mine:
            return {}
        keys = sorted(mine)
        vec = torch.tensor([mine[k] for k in keys], dtype=torch.float64, device=self.device)
        dist.all_reduce(vec, op=dist.ReduceOp.SUM)
        return {k: int(v) for k, v in zip(keys, vec.tolist())}

    def template_totals(self) -> dict[str, int]:
        names = sorted(self.spec.arm.templates)
        vec = torch.tensor([self.state.templates[n] for n in names], dtype=torch.float64, device=self.device)
        dist.all_reduce(vec, op=dist.ReduceOp.SUM)
        return {n: int(v) for n, v in zip(names, vec.tolist()) if v}

    # ---- checkpoint / export --------------------------------------------------------------------
    def save(self, folder: Path, *, meta: dict[str, Any] | None = None, nodes: int = 1,
             omit: tuple[str, ...] = ()) -> None:
        """A resumable checkpoint (collective: every rank must call it); train/checkpoint.py. `omit`
        is a test seam naming parts not to carry."""
        from ..audit.checkpoint import save

        save(self, folder, meta=meta, nodes=nodes, omit=omit)

    def load(self, folder: Path, *, nodes: int = 1) -> dict[str, Any] | None:
        """Resume from `folder` if it holds a complete checkpoint (of this world size: another one is
        refused); returns its description, or None when there is none."""
        from ..audit.checkpoint import load

        meta = load(self, folder, nodes=nodes)
        if meta is None:
            return None
        if self.weight_sync is not None:
            self.weight_sync.push(self.state.step)
        log.info("rank %d resumed at step %d (loop %.2fs)", self.rank, self.state.step, self.state.loop_seconds)
        return meta

    def probe_stop_reason(self) -> str | None:
        """Why this rank's weight-sync probes stop the run (train.max_failed_probes), or None (also
        where rollouts sample from the policy module: no probe)."""
        return self.weight_sync.stop_reason(self.cfg.max_failed_probes) if self.weight_sync is not None else None

    def loop_done(self) -> bool:
        """Has the loop reached its budget (or train.max_steps)? Checked after each step and on resume."""
        st = self.state
        return st.loop_seconds >= self.budget_seconds or bool(self.cfg.max_steps and st.step >= self.cfg.max_steps)

    def export(self, folder: Path) -> tuple[str, str | None]:
        """The final policy, in the training dtype (collective under ZeRO-3: every rank gathers each tensor
        in turn). Every rank returns the sha256 of the weights it holds, hashed tensor by tensor as they
        stream (`model.update_digest`; the ranks' must agree); rank 0 alone keeps them (one host copy)
        and writes a Hugging Face directory `from_pretrained` loads (config, safetensors, the checkpoint's
        tokenizer), returning its sha256 too; other ranks return None for it."""
        from ..pretrained.hf import export

        digest = hashlib.sha256()
        kept: dict[str, torch.Tensor] | None = {} if self.rank == 0 else None
        for name, tensor in named_full_parameters(self.engine.module, self.cfg.zero_stage):
            host = tensor.detach().cpu()
            update_digest(digest, name, host)
            if kept is not None:
                kept[name] = host
        policy_sha256 = None
        if kept is not None:
            policy_sha256 = export(self.engine.module, kept, folder, getattr(self.codec, "tokenizer", None))
        return digest.hexdigest(), policy_sha256

    def close(self) -> None:
        self.backend.close()
