"""A model folder is untrusted (ggpo_batch/train/pretrained/checkpoint_files.py): its config, generation config,
tokenizer files, safetensors weights and weight index are checked before any library reads them, and
each problem is one line under `train.model.path` naming the file. Nothing outside the folder is
read: a link leading out of it is refused, not followed (a cache snapshot's links into that model's
blobs are the folder's own). The old code hung on a FIFO, raised on a truncated or garbage
safetensors header, and read whatever a link or an index entry pointed to."""

from __future__ import annotations

import json
import os
import shutil
import struct
from collections.abc import Callable
from pathlib import Path

import pytest

from ggpo_batch.spec import preflight
from ggpo_batch.spec.parse import load_spec
from tests.faults.test_hostile_inputs import assert_refused, fingerprint, run_cli
from tests.train.hf.test_hf_preflight import copy_model

OUTSIDE_TEXT = json.dumps({"model_type": "qwen2", "planted": "outside the folder"})


def _header(tensors: dict[str, object]) -> bytes:
    raw = json.dumps(tensors).encode()
    return struct.pack("<Q", len(raw)) + raw


def _safetensors(folder: Path, tmp_path: Path, case: str) -> None:
    path = folder / "model.safetensors"
    data = path.read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    name = next(k for k in header if k != "__metadata__")
    if case == "empty weights":
        path.write_bytes(b"")
    elif case == "weights cut in the header":
        path.write_bytes(data[:8 + n // 2])
    elif case == "weights cut in the data":
        path.write_bytes(data[:len(data) - 1000])
    elif case == "garbage header":
        path.write_bytes(struct.pack("<Q", 20) + b"this is not json!!!!" + data[8 + n:])
    elif case == "non-numeric shape":
        header[name]["shape"] = ["a", 2]
        path.write_bytes(_header(header) + data[8 + n:])


def _index(folder: Path, target: str) -> None:
    (folder / "model.safetensors").rename(folder / "model-00001-of-00001.safetensors")
    (folder / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {}, "weight_map": {"model.embed_tokens.weight": target}}))


# case -> (change the copied folder, the file named, words of the problem)
CASES: dict[str, tuple[Callable[[Path, Path], None], str, str]] = {
    "empty config": (lambda f, t: (f / "config.json").write_text(""), "config.json", "is not valid JSON"),
    "config nested 100,000 deep": (lambda f, t: (f / "config.json").write_text('{"a":' * 100_000 + "1" + "}" * 100_000),
                                   "config.json", "at a.a.a.a"),
    "config with a 5,000-digit number": (
        lambda f, t: (f / "config.json").write_text('{"model_type": "qwen2", "x": ' + "9" * 5000 + "}"),
        "config.json", "at x: an integer of 5000 digits"),
    "config with 1e400": (lambda f, t: (f / "config.json").write_text('{"model_type": "qwen2", "rope_theta": 1e400}'),
                          "config.json", "at rope_theta: the number 1e400 is not finite"),
    "config a FIFO": (lambda f, t: ((f / "config.json").unlink(), os.mkfifo(f / "config.json")), "config.json",
                      "is a FIFO, not a regular file"),
    "config linked outside": (lambda f, t: ((t / "outside.json").write_text(OUTSIDE_TEXT), (f / "config.json").unlink(),
                                            (f / "config.json").symlink_to(t / "outside.json")),
                              "config.json", "is a symbolic link leading outside the model folder"),
    "garbage generation config": (lambda f, t: (f / "generation_config.json").write_text("{eos: [1, 2"),
                                  "generation_config.json", "is not valid JSON"),
    "tokenizer linked to /dev/zero": (lambda f, t: ((f / "tokenizer.json").unlink(),
                                                    (f / "tokenizer.json").symlink_to("/dev/zero")),
                                      "tokenizer.json", "is a symbolic link leading outside the model folder"),
    "tokenizer config nested deep": (
        lambda f, t: (f / "tokenizer_config.json").write_text("[" * 50_000 + "]" * 50_000),
        "tokenizer_config.json", "nested deeper than 32"),
    "empty weights": (lambda f, t: _safetensors(f, t, "empty weights"), "model.safetensors",
                      "is 0 bytes: not a safetensors file"),
    "weights cut in the header": (lambda f, t: _safetensors(f, t, "weights cut in the header"), "model.safetensors",
                                  "truncated, or not a safetensors file"),
    "weights cut in the data": (lambda f, t: _safetensors(f, t, "weights cut in the data"), "model.safetensors",
                                "truncated"),
    "garbage header": (lambda f, t: _safetensors(f, t, "garbage header"), "model.safetensors",
                       "its header is not valid JSON"),
    "non-numeric shape": (lambda f, t: _safetensors(f, t, "non-numeric shape"), "model.safetensors",
                          "is not a list of whole numbers"),
    "index entry leaving the folder": (lambda f, t: _index(f, "../outside.safetensors"), "model.safetensors.index.json",
                                       "is not a file name inside the model folder"),
    "index entry an absolute path": (lambda f, t: _index(f, "/etc/passwd"), "model.safetensors.index.json",
                                     "is not a file name inside the model folder"),
}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("case", list(CASES))
def test_each_bad_file_is_one_line_naming_the_field_and_the_file(case: str, write, tmp_path: Path,  # type: ignore[no-untyped-def]  # noqa: F811
                                                                 tiny_hf: Path) -> None:
    change, name, words = CASES[case]
    folder = copy_model(tiny_hf, tmp_path)
    change(folder, tmp_path)
    report = preflight.check(load_spec(write(model=folder)))
    assert [p.field for p in report.problems] == ["train.model.path"], report.lines()
    [line] = report.lines()
    assert f"train.model.path: {folder / name}: " in line and words in line, line
    assert "\n" not in line and len(line) < 600, line
    assert "outside the folder" not in line  # nothing from the planted file was read into the message


def _snapshot(cache: Path, tiny_hf: Path, repo_name: str) -> Path:
    """A Hugging Face cache entry: the files in blobs/, the snapshot's files links to them."""
    repo = cache / f"models--ggpo-test--{repo_name}"
    snapshot = repo / "snapshots" / ("0" * 40)
    (repo / "blobs").mkdir(parents=True)
    snapshot.mkdir(parents=True)
    for f in tiny_hf.iterdir():
        blob = repo / "blobs" / f"blob-{f.name}"
        shutil.copyfile(f, blob)
        (snapshot / f.name).symlink_to(Path("..") / ".." / "blobs" / blob.name)
    return snapshot


def test_a_cache_snapshot_is_one_folder_with_its_blobs_and_no_other(write, tmp_path: Path, tiny_hf: Path) -> None:  # type: ignore[no-untyped-def]  # noqa: F811
    snapshot = _snapshot(tmp_path / "hub", tiny_hf, "tiny")
    report = preflight.check(load_spec(write(model=snapshot)))
    assert report.ok, report.lines()
    other = _snapshot(tmp_path / "hub", tiny_hf, "other")
    (snapshot / "config.json").unlink()  # a link into another model's blobs: outside this one
    (snapshot / "config.json").symlink_to(other.parent.parent / "blobs" / "blob-config.json")
    [line] = preflight.check(load_spec(write(model=snapshot))).lines()
    assert f"{snapshot / 'config.json'}: is a symbolic link leading outside the model folder" in line


def test_enqueue_refuses_a_hostile_model_folder_with_nothing_written(env, write, tmp_path: Path,  # type: ignore[no-untyped-def]  # noqa: F811
                                                                     tiny_hf: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """Through the CLI, on both ledger backends: exit 2, one line, the ledger unchanged."""
    monkeypatch.setenv("GGPO_REDIS_URL", "memory://")
    assert run_cli("db", "upgrade").exit_code == 0
    folder = copy_model(tiny_hf, tmp_path)
    _safetensors(folder, tmp_path, "non-numeric shape")
    before = fingerprint(env["GGPO_DB_URL"])
    line = assert_refused(run_cli("enqueue", str(write(model=folder))), 2)
    assert f"train.model.path: {folder / 'model.safetensors'}: " in line
    assert fingerprint(env["GGPO_DB_URL"]) == before
