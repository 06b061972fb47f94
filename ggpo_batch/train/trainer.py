"""The ggpo trainer: one run on one allocation, readable top to bottom.

setup -> loop (rollouts, advantages, update, weight sync) until loop_seconds >= budget, finishing
the batch in flight -> export -> audit -> evaluation. Every rank runs this; ranks split the step's
groups, DeepSpeed averages gradients, and counts are summed across ranks at the end.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from ..run_record import AUX_COST_KEYS, AUX_SOURCE_KEYS, COST_KEYS, COUNT_KEYS
from ..runspec import RunSpec
from .audit import AuditResult, StepEvidence, audit
from .backends import make_backend
from .batch import LoopState, collate, loss_batch, micro_batches
from .codec import Codec, make_codec
from .config import TrainConfig
from .curriculum import Curriculum, GroupSpec
from .deepspeed_import import import_deepspeed
from .environment import GENERATED, Trajectory, start
from .ggpo import ggpo_loss, group_advantages
from .logprobs import Chunks, masked_logprobs
from .model import full_state_dict, initial_policy
from .reference import Reference, zero3_settings
from .retrieval import Retriever
from .rollouts import run_episodes
from .task import is_clean_answer, load, normalize
from .weight_sync import PROBE_TOLERANCE, WeightSync, probe_sequence


log = logging.getLogger(__name__)

# The record's counters the loop tallies (rank-summed at the end); `steps` is the loop's own.
COUNTS = tuple(k for k in COUNT_KEYS if k != "steps")
COSTS = COST_KEYS + AUX_COST_KEYS
AUX = AUX_SOURCE_KEYS


class Trainer:
    def __init__(self, spec: RunSpec, cfg: TrainConfig, *, rank: int, world: int, device: torch.device,
                 budget_seconds: float) -> None:
        deepspeed = import_deepspeed(device.type == "cuda")

        self.spec, self.cfg, self.rank, self.world, self.device = spec, cfg, rank, world, device
        self.budget_seconds = budget_seconds
        self.gcfg = cfg.ggpo
        self.data = load(cfg)
        self.retriever = Retriever(self.data.corpus)
        self.curriculum = Curriculum(spec.arm, self.data, group_size=cfg.group_size,
                                     prompts_per_step=cfg.prompts_per_step,
                                     exposures_per_step=cfg.exposures_per_step, seed=spec.seed)
        # A pretrained checkpoint: resolved once (a hub id from the local cache), read offline.
        self.model_dir = None
        if cfg.model is not None:
            from .hf import resolve

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
        self.micro_batches = micro_batches(cfg, world)
        ds_config = {
            "train_micro_batch_size_per_gpu": 1,  # nominal: a pass takes train.micro_batch_size rows
            "gradient_accumulation_steps": self.micro_batches,
            "gradient_clipping": cfg.grad_clip,
            "zero_optimization": zero3_settings(model) if cfg.zero_stage == 3 else {"stage": cfg.zero_stage},
            "optimizer": {"type": "AdamW", "params": {"lr": cfg.lr, "weight_decay": 0.0, "torch_adam": True}},
            "bf16": {"enabled": bf16},
            "fp16": {"enabled": fp16},
            "steps_per_print": 10**9,
            "wall_clock_breakdown": False,
        }
        self.engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=ds_config)
        vllm_options = {"gpu_memory_utilization": cfg.vllm_gpu_memory_utilization, "seed": spec.seed,
                        "device_index": device.index, "model_dir": self.model_dir,
                        "max_model_len": cfg.max_model_len,
                        "dtype": cfg.model.dtype if cfg.model is not None else "bfloat16",
                        "enforce_eager": cfg.vllm_enforce_eager}
        self.backend = make_backend(cfg.rollout, self.engine.module if self.shares_policy else behaviour, self.codec,
                                    **vllm_options, tensor_parallel_size=cfg.tensor_parallel_size)
        # Each push into a behaviour copy is checked by a log-prob probe (train/weight_sync.py).
        self.weight_sync = None if self.shares_policy else WeightSync(
            self.engine.module, cfg.zero_stage, self.backend, probe_sequence(self.codec, self.data.train[0]),
            PROBE_TOLERANCE["bfloat16" if bf16 else "float16" if fp16 else "float32"], device)
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
                         seed=self.spec.seed, step=step, codec=self.codec)
        return trajs

    def _aux_examples(self, groups: list[GroupSpec], trajs: list[list[Trajectory]]) -> list[tuple[list[int], int]]:
        """Supervised (tokens, answer_start) targets for exposed items whose gold answer is verified."""
        tally, out = self.state.tally, []
        for g, ts in zip(groups, trajs):
            if not g.exposure:
                continue
            seen_titles = {title for t in ts for title in t.retrieved_titles}
            for item, tmpl in g.parts:
                if item.item_id in self.state.aux_seen:
                    continue
                self.state.aux_seen.add(item.item_id)
                tally["groups_considered"] += 1
                # Verified: a gold answer is stated by a passage BM25 finds for the question.
                found = self.retriever.search(item.question, self.cfg.retrieval_top_k)
                verified = [a for a in item.answers if any(normalize(a) in normalize(p.text) for p in found)]
                if not verified:
                    tally["skipped_no_verified_target"] += 1
                    continue
                prompt, answer = self.codec.prompt(tmpl, item), self.codec.answer_target(verified[0])
                out.append((prompt + answer, len(prompt)))
                tally["examples"] += 1
                tally["answer_tokens"] += len(answer)
                tally["gold_checked_clean_answer"] += int(is_clean_answer(verified[0]))
                # Covered: the group's rollouts retrieved every supporting passage (all hops).
                covered = bool(item.support_titles) and set(item.support_titles) <= seen_titles
                tally["training_gold_with_support_title_coverage"] += int(covered)
        return out

    def _aux_loss(self, examples: list[tuple[list[int], int]]) -> torch.Tensor | None:
        n_max = torch.tensor([len(examples)], device=self.device)
        dist.all_reduce(n_max, op=dist.ReduceOp.MAX)
        if int(n_max) == 0:  # no rank has a target: no rank runs the forward (ZeRO-3 needs them paired)
            return None
        # Zero-loss DP padding: every rank runs the same number of aux rows.
        rows = [(t, [GENERATED if i >= a else 0 for i in range(len(t))], [0.0] * len(t)) for t, a in examples]
        pad = ([self.codec.pad_id] * 7, [0] * 7, [0.0] * 7)
        rows += [pad] * (int(n_max) - len(examples))
        ids, attn, src, _ = collate(rows, self.codec.pad_id)
        ids, attn = ids.to(self.device), attn.to(self.device)
        mask = (src[:, 1:] == GENERATED).to(self.device)
        tally = self.state.tally
        tally["aux_sequence_nonpadding_tokens_including_dp_padding"] += int(attn.sum())
        tally["aux_sequence_padded_tokens"] += ids.numel()
        tally["aux_loss_tokens"] += int(mask.sum())
        nll = -masked_logprobs(self.engine, self.engine.module, ids, attn, mask, 1.0, self.codec, self.chunks)
        return nll.sum() / mask.sum().clamp(min=1)

    def step(self) -> bool:
        """One batch: rollouts, advantages, one update. Returns True when the loop must stop."""
        st, cfg, tally = self.state, self.cfg, self.state.tally
        t0 = time.perf_counter()
        groups = self.curriculum.step_groups(st.step)[self.rank :: self.world]
        self.backend.wake()
        trajs = self._rollouts(groups, st.step)
        self.backend.sleep()
        rewards = torch.tensor([[t.reward for t in ts] for ts in trajs], dtype=torch.float32)
        adv = group_advantages(rewards, self.gcfg.advantage_eps)
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
        aux = self._aux_examples(groups, trajs) if self.spec.arm.auxiliary_answer_loss else []
        (ids, attn, mask, blp), row_adv, evidence = loss_batch(st.step, self.rank, trajs, rewards, adv,
                                                               self.gcfg.advantage_eps, self.codec.pad_id)
        self.evidence.append(evidence)
        ids, attn, mask = ids.to(self.device), attn.to(self.device), mask.to(self.device)
        if evidence.row_trajectories != [None]:
            tally["rl_sequence_nonpadding_tokens"] += int(attn.sum())
            tally["rl_sequence_padded_tokens"] += ids.numel()
        adv_t, blp = torch.tensor(row_adv, device=self.device), blp[:, 1:].to(self.device)
        total = mask.sum().clamp(min=1)
        aux_loss = None
        loss = torch.zeros((), device=self.device)
        # The rank's rows in `micro_batches` forward/backward passes (DeepSpeed accumulates them; the
        # optimizer steps after the last). Each part is its tokens' share of the rank's token mean, so
        # the parts sum to the loss of one whole-batch pass. Every rank runs the same number of passes
        # (ZeRO's collectives pair them): a pass with no rows left runs a 2-token zero-loss filler.
        per = ids.shape[0] if self.micro_batches == 1 else cfg.micro_batch_size
        ref = self.reference
        for j in range(self.micro_batches):
            rows = slice(j * per, (j + 1) * per)
            m = mask[rows]
            if m.shape[0] == 0:
                rows, m = slice(0, 1), torch.zeros_like(mask[:1, :1])
                part_ids, part_attn = ids[:1, :2], attn[:1, :2]
            else:
                part_ids, part_attn = ids[rows], attn[rows]
            # Log-probs of the masked targets only, in chunks (train/logprobs.py), 0 elsewhere: targets
            # outside the mask may be tool delimiters, impossible (-inf) under the policy.
            logp = masked_logprobs(self.engine, self.engine.module, part_ids, part_attn, m, cfg.temperature,
                                   self.codec, self.chunks)
            with torch.no_grad():
                ref_logp = masked_logprobs(ref.call, ref.module, part_ids, part_attn, m, cfg.temperature, self.codec,
                                           self.chunks)
            part, stats = ggpo_loss(logp, blp[rows, : m.shape[1]], ref_logp, adv_t[rows], m, self.gcfg)
            part = part * (m.sum() / total)
            tally["rl_loss_tokens"] += stats.loss_tokens
            tally["nonzero_advantage_tokens"] += stats.nonzero_advantage_tokens
            if j == self.micro_batches - 1 and self.spec.arm.auxiliary_answer_loss:
                aux_loss = self._aux_loss(aux)
                if aux_loss is not None:
                    part = part + cfg.aux_coef * aux_loss
            self.engine.backward(part, scale_wrt_gas=False)
            self.engine.step()
            loss = loss + part.detach()
        grad_norm = self.engine.get_global_grad_norm()
        gen_tokens = sum(t.generated_tokens for ts in trajs for t in ts)
        gaps = float((rewards.max(1).values - rewards.min(1).values)[adv.retained].sum())
        # One reduction carries the step's figures and the rank's loop time (ranks stop together).
        step_seconds = time.perf_counter() - t0
        red = torch.tensor([float(loss.detach()), adv.retained_groups, gaps, gen_tokens,
                            sum(len(ts) for ts in trajs), len(groups), step_seconds], dtype=torch.float64,
                           device=self.device)
        dist.all_reduce(red[:6], op=dist.ReduceOp.SUM)
        mx = red[6:].clone()
        dist.all_reduce(mx, op=dist.ReduceOp.MAX)
        step_seconds = float(mx[0])
        st.loop_seconds += step_seconds
        st.last_batch_seconds = step_seconds
        refreshed = (st.step + 1) % self.gcfg.reference_refresh_steps == 0
        # Post-update sync is outside the loop budget (seed BUDGET_LIMITATION).
        sync_seconds = self.weight_sync.push(st.step) if self.weight_sync is not None else None
        if refreshed:
            self.reference.refresh(self.engine.module)
        retained = int(red[1])
        st.history.append({
            "step": st.step, "loss": float(red[0]) / self.world,
            "gradient_norm": float(grad_norm) if grad_norm is not None else None,
            "retained_groups": retained, "rejected_groups": int(red[5]) - retained, "raw_gap": float(red[2]) / retained if retained else 0.0,
            "mean_length": float(red[3]) / max(1.0, float(red[4])), "reference_refreshed": refreshed,
            "branch": f"deepspeed_zero{cfg.zero_stage}", "loop_seconds": st.loop_seconds,
            "weight_sync_seconds": sync_seconds,
        })
        st.step += 1
        if self.rank == 0:
            log.info("step %d loss %.4f retained %d loop %.2fs", st.step, st.history[-1]["loss"], retained,
                     st.loop_seconds)
        return st.loop_seconds >= self.budget_seconds or (cfg.max_steps and st.step >= cfg.max_steps)

    # ---- phases after the loop ------------------------------------------------------------------
    def run_audit(self) -> AuditResult:
        """Every rank audits its own evidence; every rank returns the whole run's: counts summed over
        ranks (steps are shared: their count is the fewest any rank checked) and every rank's problems."""
        mine = audit(self.evidence, self.codec, self.weight_sync.log if self.weight_sync is not None else None)
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
        """The held-out evaluation (train/evaluation.py): per-item rewards, split by exposure in this arm."""
        from .evaluation import evaluate

        with self._generation_weights():
            return evaluate(self)

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

    def template_totals(self) -> dict[str, int]:
        names = sorted(self.spec.arm.templates)
        vec = torch.tensor([self.state.templates[n] for n in names], dtype=torch.float64, device=self.device)
        dist.all_reduce(vec, op=dist.ReduceOp.SUM)
        return {n: int(v) for n, v in zip(names, vec.tolist()) if v}

    # ---- checkpoint / export --------------------------------------------------------------------
    def save(self, folder: Path) -> None:
        """A resumable checkpoint (collective: every rank must call it)."""
        folder.mkdir(parents=True, exist_ok=True)
        self.engine.save_checkpoint(str(folder), tag="loop")
        torch.save({"state": self.state, "evidence": self.evidence, "reference": self.reference.state_dict()},
                   folder / f"loop_rank{self.rank}.pt")
        dist.barrier()

    def load(self, folder: Path) -> bool:
        """Resume from `folder` if it holds a complete checkpoint for this world size."""
        mine = folder / f"loop_rank{self.rank}.pt"
        ok = torch.tensor([1 if mine.is_file() else 0], device=self.device)
        dist.all_reduce(ok, op=dist.ReduceOp.MIN)
        if not int(ok):
            return False
        self.engine.load_checkpoint(str(folder), tag="loop")
        saved = torch.load(mine, weights_only=False)
        self.state, self.evidence = saved["state"], saved["evidence"]
        self.reference.load_state_dict(saved["reference"])
        if self.weight_sync is not None:
            self.weight_sync.push(self.state.step)
        log.info("rank %d resumed at step %d (loop %.2fs)", self.rank, self.state.step, self.state.loop_seconds)
        return True

    def export(self, folder: Path) -> tuple[dict[str, torch.Tensor], str | None]:
        """The final policy (collective: every rank gathers the weights). Rank 0 writes it to `folder`
        as a Hugging Face directory that `from_pretrained` loads (config, safetensors, and the
        checkpoint's tokenizer) and returns its sha256 with the weights; other ranks return None."""
        weights = full_state_dict(self.engine.module, self.cfg.zero_stage)
        digest = None
        if self.rank == 0:
            from .hf import export

            tokenizer = getattr(self.codec, "tokenizer", None)
            dtype = self.cfg.model.dtype if self.cfg.model is not None else "float32"
            digest = export(self.engine.module, weights, folder, tokenizer, dtype)
        return weights, digest

    def close(self) -> None:
        self.backend.close()
