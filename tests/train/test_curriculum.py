import pytest

pytest.importorskip("torch")
pytest.importorskip("bm25s")
pytestmark = pytest.mark.train

from ggpo_batch.contracts.runspec import ArmSpec
from ggpo_batch.errors import SpecError
from ggpo_batch.train.config import TrainConfig
from ggpo_batch.train.task.curriculum import Curriculum
from ggpo_batch.train.task.qa import synthetic

DATA = synthetic(TrainConfig())
T = ("train_direct", "train_role")
ARMS = {"clean": ArmSpec("clean"), "paired": ArmSpec("paired", "paired", 4, T),
        "random_matched": ArmSpec("random_matched", "random", 4, T)}


def cur(arm, **kw):
    opts = dict(group_size=4, prompts_per_step=4, exposures_per_step=2, seed=3) | kw
    return Curriculum(ARMS[arm], DATA, **opts)


def test_clean_exposes_nothing():
    c = cur("clean")
    assert not any(g.exposure for s in range(5) for g in c.step_groups(s))


def test_paired_shares_one_group_per_item_across_templates():
    c = cur("paired")
    assert len(c.exposure_groups) == 4
    for g in c.exposure_groups:
        assert g.shared and [t for _, t in g.parts] == ["train_direct", "train_role"]
        assert len({i.item_id for i, _ in g.parts}) == 1
    assert [i for g in c.exposure_groups for i, _ in g.parts[:1]] == list(DATA.heldout[:4])
    first = c.step_groups(0)
    assert len(first) == 4 and sum(g.exposure for g in first) == 1


def test_random_makes_the_same_number_of_unpaired_exposures():
    c = cur("random_matched")
    assert sum(len(g.parts) for g in c.exposure_groups) == ARMS["random_matched"].target_exposed == 8
    assert all(len(g.parts) == 1 and not g.shared for g in c.exposure_groups)
    assert cur("random_matched").step_groups(1) == c.step_groups(1)  # a pure function of (seed, step)


def test_bad_arms_are_refused():
    with pytest.raises(SpecError, match="group_size"):
        cur("paired", group_size=3)
    from dataclasses import replace

    with pytest.raises(SpecError, match="exposed_items"):
        Curriculum(replace(ARMS["paired"], exposed_items=999), DATA, group_size=4, prompts_per_step=4,
                   exposures_per_step=2, seed=0)
