"""Part 3 of tools/gpu/flagship_check.py: the weight-sync probe (train/run/weight_sync.py, train/audit/
probe.py) on the device's kernels, an SDPA policy against eager-attention copies of its weights, one
of them the checked rollout backend and one per planted defect of tools/bench/probe_calibration.py.
Stdlib only at import, as flagship_train."""

from __future__ import annotations

import logging
import sys
import time
from typing import Any

from tools.gpu.flagship_train import Run, build

STOP_AFTER = 3  # the planted stopped push stops after this many pushes


def progress(t0: float, message: str) -> None:
    """A line on stderr as each part ends: what a run killed at its time limit still shows."""
    print(f"[flagship_check {time.perf_counter() - t0:6.1f} s] {message}", file=sys.stderr, flush=True)


def probe_backends(policy: Any, shape: dict[str, Any], dtype: Any, device: Any, codec: Any,
                   planted: str | None) -> dict[str, Any]:
    """name -> rollout backend, each an eager-attention copy of the policy's weights: "checked" (with
    `planted`'s defect when given), then one per planted defect (figures)."""
    from ggpo_batch.train.rollout.sampler import TorchSampler
    from tools.bench.probe_calibration import DEFECTS, Planted

    def copy_of() -> Any:
        model = build(shape, dtype, device, "eager")
        model.load_state_dict(policy.state_dict())
        return TorchSampler(model.requires_grad_(False).eval(), codec)

    checked = copy_of()
    out = {"checked": Planted(checked, planted, STOP_AFTER) if planted else checked}
    out.update({d: Planted(copy_of(), d, STOP_AFTER) for d in DEFECTS})
    return out


def probe_figures(run: Run, t0: float) -> tuple[dict[str, Any], bool]:
    """Part 3: `--probe-steps` updates, each followed by a push into every eager copy and its probe
    (WeightSync's load, then its probe; the load timed to its end on the GPU). Returns the figures
    and whether the checked backend's probes all passed."""
    import torch

    from ggpo_batch.train.audit.probe import PROBE_TOKENS, merged_details
    from ggpo_batch.train.run.weight_sync import WeightSync

    a, cfg, module = run.args, run.cfg, run.engine.module
    tokens = torch.randint(0, run.shape["vocab_size"], (PROBE_TOKENS,), generator=run.gen).tolist()
    backends = probe_backends(module, run.shape, run.dtype, run.device, run.codec, a.plant_probe)
    # The planted defects' probes fail by design: their lines are the report's, not error logs.
    logging.getLogger("ggpo_batch.train.run.weight_sync").setLevel(logging.CRITICAL)
    syncs = {name: WeightSync(module, cfg.zero_stage, b, tokens, cfg.model.dtype, run.device)
             for name, b in backends.items()}
    push_seconds = []
    for i in range(a.probe_steps):
        run.step()
        for name, sync in syncs.items():
            start = time.perf_counter()
            sync.load()
            run.synchronize()
            if name == "checked":
                push_seconds.append(time.perf_counter() - start)
            sync.probe(i)
        if (i + 1) % 10 == 0:
            progress(t0, f"probe: {i + 1} of {a.probe_steps} steps, checked backend's failures so far "
                         f"{len(syncs['checked'].log.failures)}")
    checked = syncs.pop("checked").log
    eager = backends["checked"]
    out = {"backend": f"{(eager.inner if a.plant_probe else eager).model.config._attn_implementation} attention, "
                      f"{cfg.model.dtype}", "planted": a.plant_probe, "lr": run.lr, **merged_details([checked]),
           "push_seconds": push_seconds, "steps": [p.as_dict() for p in checked.probes], "defects": {}}
    for name, sync in syncs.items():
        first = next((p for p in sync.log.probes if not p.passed), None)
        out["defects"][name] = {"caught_at_step": first.step if first else None, "gap": first.gap if first else None,
                                "bound": sync.log.bound, "reason": first.reason if first else None}
    return out, checked.passed
