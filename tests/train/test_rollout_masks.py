"""Rollouts and the loss mask: the sampler's log-probs, tool tokens planted and kept out of the mask."""

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("bm25s")
pytestmark = pytest.mark.train

from ggpo_batch.train.audit.audit import audit
from ggpo_batch.train.config import TrainConfig
from ggpo_batch.train.policy.batch import collate, loss_batch
from ggpo_batch.train.policy.ggpo import group_advantages
from ggpo_batch.train.policy.model import build_model, logprobs_of
from ggpo_batch.train.rollout.environment import GENERATED, TOOL, run_episodes, start
from ggpo_batch.train.rollout.sampler import Generation, RolloutBackend, TorchSampler
from ggpo_batch.train.task.qa import render, synthetic
from ggpo_batch.train.task.retrieval import Retriever
from ggpo_batch.train.task.tokenizer import DOC_CLOSE, DOC_OPEN, EOS, SEARCH, encode

CFG = TrainConfig()
DATA = synthetic(CFG)


def test_kv_cache_sampler_logprobs_match_a_full_forward():
    model = build_model(CFG, 0)
    prompts = [encode("Question: where?"), encode("Q: x")]  # different lengths: left padding
    gens = TorchSampler(model).generate(prompts, 12, 1.0, seed=1)
    for p, g in zip(prompts, gens):
        assert 1 <= len(g.tokens) <= 12
        assert all(t not in (EOS, SEARCH) for t in g.tokens[:-1])
        ids = torch.tensor([p + list(g.tokens)])
        lp = logprobs_of(model, ids, torch.ones_like(ids), 1.0)[0, len(p) - 1 :]
        assert torch.allclose(lp, torch.tensor(g.logprobs), atol=1e-4)


def test_sync_weights_changes_the_samplers_logprobs():
    a, b = build_model(CFG, 0), build_model(CFG, 1)
    s = TorchSampler(a)
    before = s.generate([encode("Q: x")], 4, 1.0, seed=3)[0]
    s.sync_weights(dict(b.named_parameters()))
    after = s.generate([encode("Q: x")], 4, 1.0, seed=3)[0]
    assert before.logprobs != after.logprobs


class PlantingBackend(RolloutBackend):
    """Plays a fixed script instead of sampling, so tool calls happen on every trajectory.
    The environment, retrieval and collation under test are the real ones."""

    def __init__(self, turns):
        self.turns = turns
        self.calls = 0

    def generate(self, prompts, max_new_tokens, temperature, seed):
        toks = self.turns[min(self.calls, len(self.turns) - 1)]
        self.calls += 1
        return [Generation(tuple(toks), tuple(-1.0 for _ in toks)) for _ in prompts]

    def sync_weights(self, state):
        pass


def test_planted_tool_output_never_enters_the_loss_mask():
    item = next(i for i in DATA.train if i.support_title in {p.title for p in DATA.corpus})
    query = encode(item.question) + [SEARCH]
    # The answer turn repeats bytes that also occur in the retrieved passage.
    backend = PlantingBackend([query, encode(" " + item.answer) + [EOS]])
    trajs = [start(item, "train", encode(render("train", item))) for _ in range(2)]
    run_episodes(trajs, backend, Retriever(DATA.corpus), max_turns=2, max_new_tokens=64, temperature=1.0,
                 top_k=2, passage_max_bytes=64, seed=0)
    t = trajs[0]
    assert t.retrieved and t.calls == 2 and t.reward == 1.0
    assert TOOL in t.sources and DOC_OPEN in t.tokens and DOC_CLOSE in t.tokens
    ids, _, src, blp = collate([(x.tokens, x.sources, x.behaviour_logprobs) for x in trajs] +
                                [(trajs[0].tokens[:5], trajs[0].sources[:5], [0.0] * 5)])  # a padded row
    mask = src[:, 1:] == GENERATED
    targets = ids[:, 1:]
    assert int(mask[0].sum()) == len(query) + len(encode(" " + item.answer)) + 1
    assert not bool((mask & ((targets == DOC_OPEN) | (targets == DOC_CLOSE))).any())
    assert not bool(mask[2].any())  # prompt-only, padded row
    assert bool((blp[:, 1:][mask] == -1.0).all())  # behaviour logprobs line up with the mask

    # The audit re-scores the answers, so the group needs a real reward gap: trajectory 1 answers wrong.
    wrong_answer = start(item, "train", encode(render("train", item)))
    run_episodes([wrong_answer], PlantingBackend([query, encode(" 7") + [EOS]]), Retriever(DATA.corpus),
                 max_turns=2, max_new_tokens=64, temperature=1.0, top_k=2, passage_max_bytes=64, seed=0)
    group = [trajs[0], wrong_answer]
    rewards = torch.tensor([[t.reward for t in group]])
    assert rewards.tolist() == [[1.0, 0.0]]
    adv = group_advantages(rewards)
    _, _, ev = loss_batch(0, 0, [group], rewards, adv, 1e-6)
    assert audit([ev]).ok
    clean_mask = ev.loss_mask.clone()
    ev.loss_mask = clean_mask | (src[:2, 1:] == TOOL)  # plant tool tokens under the mask: the audit must refuse it
    res = audit([ev])
    assert not res.ok and any("tool delimiter" in p for p in res.problems)
    assert any("tool-output (retrieved passage) token(s) under the loss mask" in p for p in res.problems)
    ev.loss_mask, ev.row_advantages = clean_mask, torch.tensor([0.5, 0.5])
    wrong = audit([ev])
    assert not wrong.ok and "trained with advantage" in wrong.problems[0]
