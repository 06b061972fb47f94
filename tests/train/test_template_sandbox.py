"""A chat template is code (issue 42, class 10): preflight renders it in a child bounded in time and
output, and a template that never ends is refused in one line naming train.model.path."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from ggpo_batch.spec import preflight
from ggpo_batch.spec.parse import load_spec
from ggpo_batch.train.pretrained import template_sandbox
from ggpo_batch.train.pretrained.template_sandbox import Bounded

# Two nested range(100000): 10^10 iterations, as a hostile model folder's template may hold.
ENDLESS_TEMPLATE = ("{% for m in messages %}{{ m['content'] }}{% endfor %}"
                    "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"
                    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def test_a_rendering_past_its_time_or_size_is_cut_and_named() -> None:
    slow = Bounded(lambda q: (time.sleep(30), q)[1], seconds=0.5)
    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match="did not render one prompt within 0.5 s"):
        slow("q")
    assert time.monotonic() - t0 < 5 and slow.runaway is not None
    big = Bounded(lambda q: q * 10_000, max_chars=1000)
    with pytest.raises(RuntimeError, match="more than 1,000 characters"):
        big("q")
    assert Bounded(lambda q: q.upper())("q") == "Q"
    with pytest.raises(KeyError):  # the template's own error comes back as itself
        Bounded(lambda q: {}["x"])("q")


def test_preflight_refuses_a_template_that_never_ends(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("transformers")
    from ggpo_batch.train.task.tiny_hf import build_checkpoint, build_qa_set
    from tests.support.paths import JOBS
    from tests.support.specs import flagship_with

    monkeypatch.setattr(template_sandbox, "SECONDS", 3.0)
    model = build_checkpoint(tmp_path / "model", chat_template=ENDLESS_TEMPLATE)
    data = build_qa_set(tmp_path / "qa", n_train=200, n_eval=160)
    assert (JOBS / "exposure-5arm.toml").exists()
    t0 = time.monotonic()
    report = preflight.check(load_spec(flagship_with(tmp_path, model, data)))
    took = time.monotonic() - t0
    lines = [line for p, line in zip(report.problems, report.lines()) if p.field == "train.model.path"]
    assert len(lines) == 1 and "did not render one prompt within 3 s" in lines[0], report.lines()
    assert took < 30, took
