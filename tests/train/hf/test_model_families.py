"""Real checkpoints' quirks, reproduced on the tiny checkpoint with files and templates of our own
(issue 36): each one went through the preflight's own function (`preflight.check`) and was refused
or mistrained before this change."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from ggpo_batch.common import limits
from ggpo_batch.spec import preflight
from ggpo_batch.spec.parse import load_spec
from ggpo_batch.train.pretrained import checkpoint_files, hf
from ggpo_batch.train.task.codec import HfCodec
from tests.support.families import FAMILIES, write_family
from tests.train.hf.test_hf_preflight import cli_env  # noqa: F401  (a fixture)

# transformers' save_pretrained writes its "unset" model_max_length, int(1e30), as these digits.
UNSET_MAX_LENGTH = 1000000000000000019884624838656
# Gemma's turn format (our own minimal template): the assistant turn ends with <end_of_turn>.
GEMMA_LIKE = ("{{ bos_token if bos_token else '' }}{% for message in messages %}"
              "{% set role = 'model' if message['role'] == 'assistant' else message['role'] %}"
              "{{ '<start_of_turn>' + role + '\n' + message['content'] + '<end_of_turn>\n' }}{% endfor %}"
              "{% if add_generation_prompt %}{{ '<start_of_turn>model\n' }}{% endif %}")
# Llama-3.2's date line (our own minimal template): today's date unless date_string is given.
DATED = ("{% if not date_string is defined %}{% if strftime_now is defined %}"
         "{% set date_string = strftime_now('%d %b %Y') %}{% else %}{% set date_string = '26 Jul 2024' %}"
         "{% endif %}{% endif %}{{ 'Today Date: ' + date_string + '\n' }}{% for message in messages %}"
         "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}{% endfor %}"
         "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")


def _copy(tiny_hf: Path, tmp_path: Path) -> Path:
    folder = tmp_path / "model"
    shutil.copytree(tiny_hf, folder)
    return folder


def _edit(path: Path, **changes: object) -> None:
    data = json.loads(path.read_text())
    data.update(changes)
    path.write_text(json.dumps(data))


def _retokenize(folder: Path, *, template: str | None = None, special: tuple[str, ...] = (),
                plain: tuple[str, ...] = ()) -> object:
    tok = hf.load_tokenizer(folder)
    if special:
        tok.add_special_tokens({"additional_special_tokens": list(special)})
    if plain:
        tok.add_tokens(list(plain))
    if template is not None:
        tok.chat_template = template
    tok.save_pretrained(folder)
    return tok


def _problems(write, folder: Path, model_extra: str = "") -> list[str]:  # type: ignore[no-untyped-def]
    return preflight.check(load_spec(write(model=folder, model_extra=model_extra))).lines()


def test_the_unset_model_max_length_transformers_writes_is_read(write, tmp_path, tiny_hf):  # type: ignore[no-untyped-def]
    folder = _copy(tiny_hf, tmp_path)
    _edit(folder / "tokenizer_config.json", model_max_length=UNSET_MAX_LENGTH)
    assert _problems(write, folder) == []
    # The export writes the same value back (an unset model_max_length) and the next read takes it.
    tok = hf.load_tokenizer(folder)
    tok.model_max_length = int(1e30)
    out = tmp_path / "exported"
    tok.save_pretrained(out)
    assert json.loads((out / "tokenizer_config.json").read_text())["model_max_length"] == UNSET_MAX_LENGTH
    assert checkpoint_files.read_json(out / "tokenizer_config.json")["model_max_length"] == UNSET_MAX_LENGTH
    # The ledger's inputs keep the 64-bit rule; a checkpoint's JSON stops at 40 digits.
    with pytest.raises(limits.InputRefused, match="31 digits"):
        limits.load_json(json.dumps({"model_max_length": UNSET_MAX_LENGTH}))
    with pytest.raises(limits.InputRefused, match="41 digits"):
        limits.load_json("[" + "9" * 41 + "]", ledger=False)
    # The ledger's text rules (no NUL) are not a checkpoint's: a tokenizer may name any text.
    assert limits.load_json('{"unk": "\\u0000"}', ledger=False) == {"unk": "\x00"}
    with pytest.raises(limits.InputRefused, match="NUL"):
        limits.load_json('{"unk": "\\u0000"}')
    with pytest.raises(limits.InputRefused, match="not a finite number"):
        limits.load_json('{"x": NaN}', ledger=False)


def test_a_special_token_past_the_embeddings_is_allowed_a_plain_one_is_not(write, tmp_path, tiny_hf):  # type: ignore[no-untyped-def]
    folder = _copy(tiny_hf, tmp_path / "a")
    tok = _retokenize(folder, special=("<image_soft_token>",))  # gemma-3-1b-it: one past its embeddings
    _edit(folder / "config.json", vocab_size=len(tok) - 1)  # type: ignore[arg-type]
    assert _problems(write, folder) == []
    folder = _copy(tiny_hf, tmp_path / "b")
    tok = _retokenize(folder, plain=("<tool_word>",))
    _edit(folder / "config.json", vocab_size=len(tok) - 1)  # type: ignore[arg-type]
    [line] = _problems(write, folder)
    assert "added token" in line and "'<tool_word>'" in line and "is not special" in line


def test_a_chat_template_only_in_chat_template_json_is_loaded_and_exported(write, tmp_path, tiny_hf):  # type: ignore[no-untyped-def]
    folder = _copy(tiny_hf, tmp_path)
    template = (folder / "chat_template.jinja").read_text()
    (folder / "chat_template.jinja").unlink()
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    (folder / "chat_template.json").write_text(json.dumps({"chat_template": template}))
    assert _problems(write, folder) == []
    tok = hf.load_tokenizer(folder)
    assert tok.chat_template == template
    tok.save_pretrained(tmp_path / "exported")  # what hf.export writes beside the policy
    assert hf.load_tokenizer(tmp_path / "exported").chat_template == template


def test_the_answer_ends_with_the_templates_end_of_turn(write, tmp_path, tiny_hf):  # type: ignore[no-untyped-def]
    folder = _copy(tiny_hf, tmp_path)
    tok = _retokenize(folder, template=GEMMA_LIKE, special=("<start_of_turn>", "<end_of_turn>"))
    end = tok.convert_tokens_to_ids("<end_of_turn>")  # type: ignore[attr-defined]
    _edit(folder / "config.json", vocab_size=len(tok), eos_token_id=[tok.eos_token_id, end])  # type: ignore[arg-type,attr-defined]
    (folder / "generation_config.json").unlink()
    assert _problems(write, folder) == []
    codec = HfCodec(hf.load_tokenizer(folder), max_model_len=1024, eos_ids=hf.eos_ids(folder))
    assert codec.answer_target("Zo")[-1] == end != tok.eos_token_id  # type: ignore[attr-defined]
    assert end in codec.stop_ids
    # Without generation_config.json, config.json's own eos list is the stop set's fallback.
    assert hf.eos_ids(folder) == [tok.eos_token_id, end]  # type: ignore[attr-defined]


def test_a_prompt_with_todays_date_is_refused_until_the_date_is_pinned(write, tmp_path, tiny_hf):  # type: ignore[no-untyped-def]
    folder = _copy(tiny_hf, tmp_path)
    _retokenize(folder, template=DATED)
    [line] = _problems(write, folder)
    assert "train.model.chat_template_kwargs" in line and "today's date" in line and "date_string" in line
    report = preflight.check(load_spec(write(model=folder, model_extra='chat_template_kwargs = { date_string = "26 Jul 2024" }')))
    assert report.ok, report.lines()
    facts = report.facts["chat_template"]
    assert facts["kwargs"] == {"date_string": "26 Jul 2024"} and "Today Date: 26 Jul 2024" in facts["rendering"]
    assert len(facts["sha256"]) == 64


def test_the_keywords_listed_are_the_templates_free_variables(write, tmp_path, tiny_hf):  # type: ignore[no-untyped-def]
    folder = _copy(tiny_hf, tmp_path)
    # Names assigned in one branch and read after: Jinja counts them as context names (Mixtral's
    # loop_messages, Gemma-2's role).
    _retokenize(folder, template=GEMMA_LIKE.replace("{% for message in messages %}",
                                                    "{% if messages[0]['role'] == 'system' %}"
                                                    "{% set loop_messages = messages[1:] %}{% else %}"
                                                    "{% set loop_messages = messages %}{% endif %}"
                                                    "{% for message in loop_messages %}"
                                                    "{% if message['role'] == 'user' %}{% set content = "
                                                    "message['content'] %}{% endif %}"),
                special=("<start_of_turn>", "<end_of_turn>"))
    _edit(folder / "config.json", vocab_size=len(hf.load_tokenizer(folder)))
    [line] = _problems(write, folder, "chat_template_kwargs = { colour = 1 }")
    assert "`colour` is never read" in line and "the keywords it reads: bos_token" in line
    assert not any(name in line for name in ("loop_messages", "content", "role"))


def test_safetensors_sub_byte_dtypes_are_sized_in_bits(tmp_path):  # type: ignore[no-untyped-def]
    import struct

    def write(name: str, dtype: str, shape: list[int], nbytes: int) -> Path:
        header = json.dumps({"w": {"dtype": dtype, "shape": shape, "data_offsets": [0, nbytes]}}).encode()
        path = tmp_path / name
        path.write_bytes(struct.pack("<Q", len(header)) + header + b"\0" * nbytes)
        return path

    assert checkpoint_files.safetensors_header(write("f4.safetensors", "F4", [4, 6], 12))
    assert checkpoint_files.safetensors_header(write("f6.safetensors", "F6_E2M3", [4, 4], 12))
    assert checkpoint_files.safetensors_header(write("e8.safetensors", "F8_E8M0", [3], 3))
    with pytest.raises(checkpoint_files.CheckpointFileError, match="not a whole number of bytes"):
        checkpoint_files.safetensors_header(write("odd.safetensors", "F4", [3], 2))


@pytest.mark.parametrize("family", FAMILIES, ids=[f.name for f in FAMILIES])
def test_each_family_shape_through_preflight(family, write, tmp_path):  # type: ignore[no-untyped-def]
    from ggpo_batch.train.task.tiny_family import build

    model = build(write_family(family, tmp_path / "source"), tmp_path / "model")
    lines = _problems(write, model)
    if family.refusal is None:
        assert lines == []
    else:
        assert len(lines) == 1 and family.refusal in lines[0], lines
    if family.kwargs:
        report = preflight.check(load_spec(write(model=model, model_extra=f"chat_template_kwargs = {{ {family.kwargs} }}")))
        assert report.ok, report.lines()
    if family.refusal is None or family.kwargs:
        codec = HfCodec(hf.load_tokenizer(model), max_model_len=1024, eos_ids=hf.eos_ids(model))
        assert codec.tokenizer.convert_ids_to_tokens(codec.answer_target("Zo")[-1]) == family.end


@pytest.mark.redis
def test_enqueue_dry_run_names_the_date_fix_then_records_the_prompts_provenance(cli_env, ledger, redis_url, write, tmp_path):  # type: ignore[no-untyped-def]  # noqa: F811
    from tests.train.hf.test_hf_preflight import _enqueue

    [family] = [f for f in FAMILIES if f.name == "llama-3.2"]
    from ggpo_batch.train.task.tiny_family import build

    model = build(write_family(family, tmp_path / "source"), tmp_path / "model")
    res = _enqueue(str(write(model=model)), "--dry-run")
    assert res.exit_code == 2 and "today's date" in res.stderr and "date_string" in res.stderr, res.output
    res = _enqueue(str(write(model=model, model_extra=f"chat_template_kwargs = {{ {family.kwargs} }}")), "--dry-run",
                   "--json")
    assert res.exit_code == 0, res.output
    facts = json.loads(res.stdout)["preflight"]
    assert facts["end_of_turn"] == "<|eot_id|>" and facts["chat_template"]["kwargs"] == {"date_string": "26 Jul 2024"}


@pytest.mark.train
@pytest.mark.slow
@pytest.mark.parametrize("name", ["gemma-3-template-json", "phi-3"])
def test_one_training_step_of_a_family_shape(name, tmp_path, qa_files):  # type: ignore[no-untyped-def]
    """A run of a family shape (gemma-3: template in chat_template.json, int(1e30) model_max_length,
    one special token past the embeddings; phi-3: <|end|>) trains, validates and exports its template."""
    pytest.importorskip("deepspeed")
    from click.testing import CliRunner

    from ggpo_batch.cli import cli
    from ggpo_batch.contracts.allocation import details_of
    from ggpo_batch.contracts.run_record import TRAINING_STATUS_VALIDATED
    from ggpo_batch.train.run.job import policy_dir
    from ggpo_batch.train.task.tiny_family import build
    from tests.train.hf.test_hf_training import write_spec

    [family] = [f for f in FAMILIES if f.name == name]
    model = build(write_family(family, tmp_path / "source"), tmp_path / "model")
    out = tmp_path / "record.json"
    res = CliRunner().invoke(cli, ["train", str(write_spec(tmp_path, model, qa_files)), "--arm", "paired_answer",
                                   "--seed", "7", "-o", str(out)], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    rec, details = json.loads(out.read_text()), json.loads(details_of(out).read_text())
    assert rec["training"]["status"] == TRAINING_STATUS_VALIDATED, details["audit"]["problems"]
    assert rec["training"]["counts"]["steps"] >= 1
    assert hf.load_tokenizer(policy_dir(out)).chat_template == family.template
