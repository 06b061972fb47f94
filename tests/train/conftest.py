import json

import pytest

from ggpo_batch.contracts.runspec import ArmSpec, RunSpec
from tests.support.arms import ARMS
from tests.support.paths import SEED_000


def make_spec(arm: str, *, seed: int = 7, budget: float = 2.0, **train) -> RunSpec:
    return RunSpec(run_key=f"{seed}/{arm}", experiment="test", experiment_version=1, method="ggpo", arm=ARMS[arm],
                   seed=seed, gpus=4, loop_budget_seconds=budget, executor="local", profile="default", train=train)


@pytest.fixture(scope="session")
def seed_records() -> dict:
    return json.loads(SEED_000.read_text())


@pytest.fixture(scope="session")
def arms() -> dict[str, ArmSpec]:
    return ARMS


@pytest.fixture(scope="session")
def spec_for():
    return make_spec
