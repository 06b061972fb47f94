"""`python tools/check/real_models.py DIR`: every family folder of DIR (a checkpoint's metadata:
config.json, tokenizer_config.json, ...) laid onto a tiny checkpoint (ggpo_batch/train/task/tiny_family.py)
and checked by the preflight's own function, as `enqueue --dry-run` checks a spec; once plain, and
once more with the keywords the first refusal names (chat_template_kwargs). Not run by the suite: DIR
holds real checkpoints' files, kept beside the project.

A family passes when its spec passes preflight, or when preflight refuses it with the documented
refusal naming the fix (a thinking-only template: "open <think> block"). Exit 1 if one does not.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

SPEC = """schema = 1
[experiment]
name = "{name}"
method = "ggpo"
seeds = [1]
gpus = 1
loop_budget_seconds = 2
executor = "local"
max_gpu_hours = 1.0
[overheads]
setup_export_seconds = 1
audit_seconds = 1
evaluation_seconds = 1
[train]
max_turns = 3
max_new_tokens = 16
passage_max_bytes = 96
eval_size = 4
[train.model]
path = "{model}"
dtype = "float32"
max_model_len = 2048
{kwargs}
[train.data]
train = "{data}/train.jsonl"
eval = "{data}/eval.jsonl"
passages = "{data}/passages.jsonl"
[arms.clean]
exposure = "none"
[arms.paired]
exposure = "paired"
exposed_items = 4
templates = ["train_direct", "train_role"]
"""
# The keywords each documented refusal asks for, tried once when it is named.
FIXES = {"date_string": 'date_string = "26 Jul 2024"', "enable_thinking": "enable_thinking = false"}
DOCUMENTED = "open <think> reasoning block"


def check(family: Path, work: Path, data: Path) -> tuple[str, list[str]]:
    """(verdict, lines) of one family folder."""
    from ggpo_batch.spec import preflight
    from ggpo_batch.spec.parse import load_spec
    from ggpo_batch.train.task.tiny_family import build

    model = build(family, work / family.name)
    name = "real-" + "".join(c if c.isalnum() else "_" for c in family.name)
    kwargs: list[str] = []
    shown: list[str] = []
    for _ in range(3):
        spec = work / f"{family.name}.toml"
        table = f"chat_template_kwargs = {{ {', '.join(kwargs)} }}" if kwargs else ""
        spec.write_text(SPEC.format(name=name, model=model, data=data, kwargs=table))
        report = preflight.check(load_spec(spec))
        lines = [f"{p.field}: {p.message.replace(str(model) + ': ', '')}" for p in report.problems]
        shown += [f"  with chat_template_kwargs {{{', '.join(kwargs)}}}" if kwargs else "  plain"] + \
            [f"    {line}" for line in lines]
        if report.ok:
            return ("PASS" + (f" with {{{', '.join(kwargs)}}}" if kwargs else "")), shown + \
                [f"    end of turn {report.facts.get('end_of_turn')!r}"]
        more = [fix for key, fix in FIXES.items() if any(key in line for line in lines) and fix not in kwargs]
        if not more:
            break
        kwargs += more
    if lines and all(DOCUMENTED in line for line in lines):
        return "PASS (documented refusal)", shown
    return "FAIL", shown


def main(argv: list[str]) -> int:
    import logging

    from transformers.utils import logging as hf_logging

    from ggpo_batch.train.task.tiny_hf import build_qa_set

    logging.disable(logging.WARNING)
    hf_logging.disable_progress_bar()
    if len(argv) != 1:
        print(__doc__)
        return 2
    families = sorted(p for p in Path(argv[0]).iterdir() if (p / "config.json").is_file())
    failed = 0
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        data = build_qa_set(work / "qa", n_train=40, n_eval=40)["eval"].parent
        for family in families:
            try:
                verdict, lines = check(family, work, data)
            except Exception as exc:  # noqa: BLE001  (a family the builder cannot lay out: reported, not hidden)
                verdict, lines = "FAIL", [f"  {type(exc).__name__}: {str(exc).splitlines()[0][:300]}"]
            failed += verdict == "FAIL"
            print(f"{family.name}: {verdict}")
            print("\n".join(lines))
    print(f"{len(families) - failed}/{len(families)} families pass")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
