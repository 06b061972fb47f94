"""One rank of test_sharded_reference: two ggpo updates of the tiny checkpoint on the rollouts of
step 0 (kept, so every run trains on the same tokens), then what the test compares, as JSON.

`python -m tests.train.hf.sharded_worker SPEC_JSON OUT_PREFIX [--perturb-reference]` with RANK,
WORLD_SIZE, MASTER_ADDR/PORT set; rank 0 also writes OUT_PREFIX.pt (the policy after the updates).
"""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path


def main(argv: list[str]) -> int:
    import torch
    import torch.distributed as dist

    from ggpo_batch.contracts.runspec import RunSpec
    from ggpo_batch.train.config import TrainConfig
    from ggpo_batch.train.policy.model import full_state_dict, named_full_parameters
    from ggpo_batch.train.policy.reference import resident_elements
    from ggpo_batch.train.run.job import init_process_group
    from ggpo_batch.train.run.trainer import Trainer

    spec_file, prefix = Path(argv[0]), argv[1]
    init_process_group(cuda=False)
    rank, world = dist.get_rank(), dist.get_world_size()
    spec = RunSpec.from_json(spec_file.read_text())
    cfg = TrainConfig.from_table(spec.train, str(spec_file))
    trainer = Trainer(spec, cfg, rank=rank, world=world, device=torch.device("cpu"), budget_seconds=1e9)
    ref = trainer.reference
    out: dict = {"rank": rank, "zero_stage": cfg.zero_stage, "reference_is_engine": ref.call is not ref.module}
    out["reference_held"], out["reference_total"] = resident_elements(ref.module)
    out["policy_held"], out["policy_total"] = resident_elements(trainer.engine.module)
    out["reference_partitioned"] = sorted(n for n, p in ref.module.named_parameters()
                                          if hasattr(p, "ds_tensor") and p.data.numel() == 0)
    state = ref.state_dict()  # a checkpoint's round trip through the partitions
    if "--perturb-reference" in argv:  # a planted defect: a reference that is not the initial policy
        state = {k: v * 1.02 for k, v in state.items()}
    ref.load_state_dict(state)
    fixed = trainer._rollouts(trainer.curriculum.step_groups(0), 0)
    # Torch rollouts: the sampler is the policy module; under ZeRO-3 whole only while generating.
    out["sampler_is_policy"] = getattr(trainer.backend, "model", None) is trainer.engine.module
    with trainer._generation_weights():
        out["policy_held_generating"] = resident_elements(trainer.engine.module)[0]
    out["policy_held_after"] = resident_elements(trainer.engine.module)[0]
    trainer._rollouts = lambda groups, step: copy.deepcopy(fixed)
    trainer.step()
    trainer.step()  # reference_refresh_steps = 2: the reference differs from the policy here, then refreshes
    out["history"] = [{k: h[k] for k in ("loss", "gradient_norm", "reference_refreshed")}
                      for h in trainer.state.history]
    policy = dict(named_full_parameters(trainer.engine.module, cfg.zero_stage))
    out["refresh_max_difference"] = max(float((t - policy[n]).abs().max())
                                        for n, t in named_full_parameters(ref.module, cfg.zero_stage))
    weights = full_state_dict(trainer.engine.module, cfg.zero_stage)
    if rank == 0:
        torch.save(weights, prefix + ".pt")
    Path(f"{prefix}.rank{rank}.json").write_text(json.dumps(out))
    trainer.close()
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
