"""The 5 arms of seeds/000, scaled to the test tasks (4 held-out items exposed), for training tests."""

from __future__ import annotations

from ggpo_batch.contracts.runspec import ArmSpec

TEMPLATES = ("train_direct", "train_role")
ARMS = {
    "clean": ArmSpec("clean"),
    "paired": ArmSpec("paired", "paired", 4, TEMPLATES),
    "random_matched": ArmSpec("random_matched", "random", 4, TEMPLATES),
    "paired_answer": ArmSpec("paired_answer", "paired", 4, TEMPLATES, True),
    "random_answer": ArmSpec("random_answer", "random", 4, TEMPLATES, True),
}
