"""Mechanism checks that are not a by-product of a seed run: each one runs the real code path on
purpose-built input and reports what it observed (True/False), never a constant."""

from __future__ import annotations

import logging
import os
import tempfile
from pathlib import Path

import torch

from ..train.policy.ggpo import GgpoConfig, ggpo_loss
from .corpus import CorpusError, load_file
from .watch import watching

log = logging.getLogger(__name__)

NOT_APPLICABLE = "not_applicable"


def oversized_corpus_rejected_before_read(max_bytes: int) -> bool:
    """A sparse file one byte over the cap must raise CorpusError without ever being opened.

    The file is sparse (truncate, no data written), so the check costs nothing even for a large cap;
    "not opened" is observed through the interpreter's audit hook, not assumed.
    """
    with tempfile.TemporaryDirectory(prefix="ggpo-oversize-") as tmp:
        path = Path(tmp) / "oversized.txt"
        with open(path, "wb") as fh:
            fh.truncate(max_bytes + 1)
        with watching() as seen:
            try:
                load_file(path, corpus_id="check:oversized", expected_sha256=None, max_bytes=max_bytes)
            except CorpusError as exc:
                refused = "over the cap" in exc.message
            else:
                refused = False
        opened = seen.opened_path(path)
        if opened:
            log.warning("oversized corpus check: %s was opened before being refused", path)
        return refused and not opened and os.path.getsize(path) == max_bytes + 1


def extreme_finite_padding_zero_gradients(config: GgpoConfig, magnitude: float = 1e4) -> bool:
    """Padding positions (loss_mask False) holding extreme finite logprobs must not move the loss
    or receive gradient: the loss and the gradients on real tokens must equal those of a copy with
    benign padding, and padding gradients must be exactly zero."""
    gen = torch.Generator().manual_seed(0)
    b, t = config.group_size, 6
    base = -torch.rand(b, t, generator=gen) * 3
    mask = torch.ones(b, t, dtype=torch.bool)
    mask[:, 4:] = False
    mask[0, 2:] = False
    adv = torch.linspace(-1.0, 1.0, b)

    def run(pad_policy: float, pad_behaviour: float, pad_reference: float) -> tuple[torch.Tensor, torch.Tensor]:
        lp = torch.where(mask, base, torch.full_like(base, pad_policy)).requires_grad_(True)
        beh = torch.where(mask, base - 0.05, torch.full_like(base, pad_behaviour))
        ref = torch.where(mask, base + 0.05, torch.full_like(base, pad_reference))
        loss, _ = ggpo_loss(lp, beh, ref, adv, mask, config)
        loss.backward()
        assert lp.grad is not None
        return loss.detach(), lp.grad

    ok_loss, ok_grad = run(-1.0, -1.0, -1.0)
    for pads in ((magnitude, -magnitude, -magnitude), (-magnitude, magnitude, magnitude)):
        loss, grad = run(*pads)
        if not bool(torch.isfinite(loss)) or not bool(torch.isfinite(grad).all()):
            return False
        if not torch.equal(grad[~mask], torch.zeros_like(grad[~mask])):
            return False
        if not torch.allclose(loss, ok_loss) or not torch.allclose(grad[mask], ok_grad[mask]):
            return False
    return True
