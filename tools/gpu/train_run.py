"""GPU check 2: the training job itself on one GPU with vLLM rollouts, bf16, for a short budget.

Prints steps/s over the loop and checks the record against the seed-000 schema.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from ggpo_batch.contracts.run_record import check_run_record, entry_key
from ggpo_batch.contracts.runspec import ArmSpec, RunSpec
from ggpo_batch.train.run.job import TrainingJob


def main() -> int:
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "/tmp/ggpo-gpu-smoke/record.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    budget = float(os.environ.get("SMOKE_BUDGET_SECONDS", "45"))
    arm = ArmSpec("paired_answer", "paired", 8, ("train_direct", "train_role"), True)
    train = {"rollout": "vllm", "n_embd": 256, "n_layer": 4, "n_head": 4, "group_size": 8, "prompts_per_step": 8,
             "max_new_tokens": 32, "vllm_gpu_memory_utilization": 0.2}
    spec = RunSpec(run_key="1/paired_answer", experiment="gpu-smoke", experiment_version=1, method="ggpo", arm=arm,
                   seed=1, gpus=1, loop_budget_seconds=budget, executor="local", profile="default", train=train)
    os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT="29561")
    rec = TrainingJob(spec.to_json(), str(out))()
    steps, loop = rec["budget"]["effective_steps"], rec["budget"]["loop_seconds"]
    details = json.loads(Path(str(out) + ".details.json").read_text())
    h = details["history"]
    print(f"steps {steps} in {loop:.1f}s loop: {steps / loop:.2f} steps/s; first loss {h[0]['loss']:.4f}, "
          f"last loss {h[-1]['loss']:.4f}; status {rec['training']['status']}")
    print("counts", json.dumps(rec["training"]["counts"]))
    problems = check_run_record(entry_key(1, "paired_answer"), rec)
    print("RECORD OK" if not problems else f"RECORD PROBLEMS: {problems}")
    return 0 if not problems else 1


if __name__ == "__main__":
    sys.exit(main())
