"""The policy's side of the task protocol: how prompts, search calls, tool output and answers are
tokens. Two codecs behind one interface, chosen by the spec (`make_codec`):

- `ByteCodec`, the built-in byte GPT-2's: bytes, EOS, and tool tokens (`tokenizer.py`). A turn that
  ends with the SEARCH token is a query; the environment writes passages between DOC_OPEN and
  DOC_CLOSE, tokens the policy can never produce.
- `HfCodec`, a pretrained checkpoint's: its own tokenizer and chat template. The prompt is the
  chat template's rendering of one user message (the tool instructions and the question) with the
  assistant turn opened, with the spec's template keywords (`chat_template_kwargs`). The protocol is text the model writes and the environment parses: a turn
  that writes `<search>query</search>` is a search call (generation stops at `</search>`); the
  environment appends the passages as `<information>...</information>` tokens (tool output, never
  under the loss); any other turn is the answer, ended by the chat format's end of turn (the token the template
  writes after an assistant turn; the tokenizer's EOS where it writes none), the text inside
  `<answer>...</answer>` when the model wrote the tags, else the whole turn.

Every token of a trajectory is placed by token ids, never by re-tokenising text, so the loss mask
holds exactly the tokens the rollout backend generated.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ..task_config import SINGLE_TURN
from . import tokenizer as byte

if TYPE_CHECKING:
    from ..config import TrainConfig
    from .qa import Item, Passage

SEARCH_OPEN, SEARCH_CLOSE = "<search>", "</search>"
INFO_OPEN, INFO_CLOSE = "<information>", "</information>"
ANSWER_OPEN, ANSWER_CLOSE = "<answer>", "</answer>"
_ANSWER_MARK = "GGPO answer mark"  # an assistant turn's text, to find what the template writes after it


def instruction() -> str:
    """The tool instructions put before the question in the user message (HF codec)."""
    return (f"Answer the question. To look something up, write {SEARCH_OPEN}query{SEARCH_CLOSE}; the results "
            f"appear between {INFO_OPEN} and {INFO_CLOSE}. You may search several times. Give the final answer "
            f"as {ANSWER_OPEN}answer{ANSWER_CLOSE}.")


def truncate_utf8(text: str, max_bytes: int) -> str:
    return text.encode("utf-8")[:max_bytes].decode("utf-8", errors="ignore")


class Codec(abc.ABC):
    """Tokens of the task protocol for one policy vocabulary."""

    pad_id: int
    stop_ids: frozenset[int]  # a turn ends on any of these (EOS; the byte codec's SEARCH)
    stop_strings: tuple[str, ...] = ()  # ... or once its text contains one of these
    env_only_ids: tuple[int, ...] = ()  # ids only the environment writes: impossible for the policy
    max_model_len: int

    @abc.abstractmethod
    def prompt(self, template: str, item: Item) -> list[int]:
        """The prompt tokens of `item` through `template` (task.TEMPLATES)."""

    @abc.abstractmethod
    def decode(self, ids: Sequence[int]) -> str:
        """Text of `ids`, special tokens dropped."""

    @abc.abstractmethod
    def search_query(self, turn: Sequence[int]) -> str | None:
        """The query of a turn that is a search call, else None (the turn is an answer)."""

    @abc.abstractmethod
    def answer_text(self, turn: Sequence[int]) -> str:
        """The answer a final turn gives (what the verifier scores)."""

    @abc.abstractmethod
    def tool_output(self, passages: Sequence[Passage], max_bytes: int) -> list[int]:
        """The tokens the environment appends after a search call (each passage cut to max_bytes)."""

    @abc.abstractmethod
    def answer_target(self, answer: str) -> list[int]:
        """A supervised answer turn (the auxiliary answer loss): its tokens, end of turn included."""

    # Token ids whose text holds the last character of a stop string: only they can complete one.
    _closing: frozenset[int] | None = None

    def turn_ended(self, turn: Sequence[int]) -> bool:
        """Whether a turn being sampled is over (a stop id, or a stop string in its text)."""
        if turn and turn[-1] in self.stop_ids:
            return True
        if self.stop_strings and turn and (self._closing is None or turn[-1] in self._closing):
            tail = self.decode(turn[-24:])
            return any(s in tail for s in self.stop_strings)
        return False

    def policy_logits(self, logits: Any) -> Any:
        """`logits` [..., V] as float32, environment-only tokens made impossible."""
        logits = logits.float()
        if self.env_only_ids:
            logits = logits.clone()
            logits[..., list(self.env_only_ids)] = float("-inf")
        return logits


class ByteCodec(Codec):
    """The built-in byte vocabulary (`tokenizer.py`): 256 bytes, EOS, SEARCH and the document tokens."""

    pad_id = byte.EOS
    stop_ids = byte.STOP_TOKENS
    env_only_ids = byte.ENV_ONLY_TOKENS

    def __init__(self, max_model_len: int = 512) -> None:
        self.max_model_len = max_model_len

    def prompt(self, template: str, item: Item) -> list[int]:
        from .qa import render

        return byte.encode(render(template, item))

    def decode(self, ids: Sequence[int]) -> str:
        return byte.decode(list(ids))

    def search_query(self, turn: Sequence[int]) -> str | None:
        return self.decode(turn) if turn and turn[-1] == byte.SEARCH else None

    def answer_text(self, turn: Sequence[int]) -> str:
        return self.decode(turn)

    def tool_output(self, passages: Sequence[Passage], max_bytes: int) -> list[int]:
        out: list[int] = []
        for p in passages:
            out += [byte.DOC_OPEN] + byte.encode(f"{p.title}: {p.text}")[:max_bytes] + [byte.DOC_CLOSE]
        return out

    def answer_target(self, answer: str) -> list[int]:
        return byte.encode(" " + answer) + [byte.EOS]


class HfCodec(Codec):
    """A Hugging Face tokenizer with a chat template; the search protocol is text (module docstring)."""

    stop_strings = (SEARCH_CLOSE,)

    def __init__(self, tokenizer: Any, *, max_model_len: int, eos_ids: Sequence[int] = (),
                 chat_template_kwargs: Mapping[str, Any] | None = None) -> None:
        self.tokenizer = tokenizer
        self.max_model_len = max_model_len
        # The template's keywords (`[train.model] chat_template_kwargs`): every prompt is rendered with them.
        self.chat_template_kwargs = dict(chat_template_kwargs or {})
        # A turn ends with the chat format's end of turn (the token its template writes after an
        # assistant turn: <end_of_turn> for Gemma, <|end|> for Phi-3/4), else the tokenizer's EOS.
        turn_end = end_of_turn_id(tokenizer, self.chat_template_kwargs)
        eos = [i for i in (turn_end, tokenizer.eos_token_id, *eos_ids) if i is not None]
        if not eos:
            raise ValueError("the tokenizer has no EOS token")
        self.eos_id = eos[0]
        self.stop_ids = frozenset(eos)
        pad = tokenizer.pad_token_id
        self.pad_id = pad if pad is not None else self.eos_id
        # A token whose text holds ">" spells it in its vocabulary piece too: byte-level BPE maps
        # printable ASCII to itself, SentencePiece writes it as is or as the byte piece "<0x3E>".
        # No piece at all with it: an unusual vocabulary, so every token is decoded (None).
        ends = {st[-1] for st in self.stop_strings}
        pieces = tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))
        closing = frozenset(i for i, p in enumerate(pieces) if isinstance(p, str) and any(e in p for e in ends))
        self._closing = closing or None

    def _encode(self, text: str) -> list[int]:
        # split_special_tokens: text from the data (a passage, a question) can never become a special
        # token such as the chat template's end-of-turn.
        return list(self.tokenizer(text, add_special_tokens=False, split_special_tokens=True)["input_ids"])

    @staticmethod
    def user_message(question_text: str) -> str:
        """The one user message of a prompt: the tool instructions, then the question."""
        return f"{instruction()}\n\n{question_text}"

    def chat_text(self, content: str) -> str:
        """The chat template's rendering of one user message `content` with the assistant turn opened,
        with the spec's template keywords: the one place a prompt is rendered (training, evaluation,
        the weight-sync probe and preflight all come here)."""
        return self.tokenizer.apply_chat_template([{"role": "user", "content": content}], tokenize=False,
                                                  add_generation_prompt=True, **self.chat_template_kwargs)

    def chat_prompt(self, question_text: str) -> list[int]:
        text = self.chat_text(self.user_message(question_text))
        # The template's own special tokens (BOS, turn markers) are in `text`: parse them as such.
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def prompt(self, template: str, item: Item) -> list[int]:
        from .qa import render

        if item.single_turn:
            return self.single_turn_prompt(item)
        return self.chat_prompt(render(template, item))

    def single_turn_prompt(self, item: Item) -> list[int]:
        """A single-turn item's prompt as TRL builds it: a chat through the chat template with the assistant
        turn opened (with the spec's template keywords); text as it is, with the tokenizer's own special
        tokens (no tool instructions either way)."""
        if isinstance(item.prompt, str):
            return list(self.tokenizer(item.prompt)["input_ids"])
        messages = [{"role": r, "content": c} for r, c in item.prompt or ()]
        text = self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True,
                                                  **self.chat_template_kwargs)
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=True)

    def search_query(self, turn: Sequence[int]) -> str | None:
        text = self.decode(turn)
        end = text.find(SEARCH_CLOSE)
        if end < 0:
            return None
        before = text[:end]
        start = before.rfind(SEARCH_OPEN)
        return (before[start + len(SEARCH_OPEN):] if start >= 0 else before).strip()

    def answer_text(self, turn: Sequence[int]) -> str:
        text = self.decode(turn)
        start = text.find(ANSWER_OPEN)
        if start >= 0:
            end = text.find(ANSWER_CLOSE, start)
            return text[start + len(ANSWER_OPEN): end if end >= 0 else len(text)].strip()
        return text.strip()

    def tool_output(self, passages: Sequence[Passage], max_bytes: int) -> list[int]:
        body = "".join(f"Doc {i + 1}: {truncate_utf8(f'(Title: {p.title}) {p.text}', max_bytes)}\n"
                       for i, p in enumerate(passages)) or "No results.\n"
        return self._encode(f"\n\n{INFO_OPEN}\n{body}{INFO_CLOSE}\n\n")

    def tool_output_bound(self, passages: int, max_bytes: int) -> int:
        """At most this many tokens of tool output for `passages` passages: a passage is cut to max_bytes,
        and a token holds at least one byte (2 tokens of slack per piece for a tokenizer's word prefix)."""
        overhead = len(self._encode(f"\n\n{INFO_OPEN}\nNo results.\n{INFO_CLOSE}\n\n")) + 2
        return overhead + passages * (max_bytes + len(self._encode("Doc 99: \n")) + 4)

    def answer_target(self, answer: str) -> list[int]:
        return self._encode(f"{ANSWER_OPEN}{answer}{ANSWER_CLOSE}") + [self.eos_id]


def end_of_turn_id(tokenizer: Any, kwargs: Mapping[str, Any]) -> int | None:
    """The token the chat template writes right after an assistant turn's text (`<|im_end|>`,
    `<end_of_turn>`, `<|end|>`, `<|eot_id|>`, `</s>`): what ends a supervised answer. None where the
    template does not render an assistant turn or writes no added token after it."""
    messages = [{"role": "user", "content": "Where was the founder of Kazo born?"}, {"role": "assistant", "content": _ANSWER_MARK}]
    try:
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=False, **kwargs)
    except Exception:  # noqa: BLE001  (a template that refuses the conversation: the tokenizer's EOS then)
        return None
    at = text.rfind(_ANSWER_MARK)
    if at < 0:
        return None
    ids = tokenizer(text[at + len(_ANSWER_MARK):], add_special_tokens=False)["input_ids"]
    added = set(getattr(tokenizer, "added_tokens_decoder", {}) or {})
    return ids[0] if ids and ids[0] in added else None


def make_codec(cfg: TrainConfig, model_dir: str | None = None) -> Codec:
    """The codec of the configured policy: bytes without `[train.model]`, else the checkpoint's tokenizer."""
    if cfg.model is None:
        return ByteCodec(cfg.n_positions)
    from ..pretrained.hf import eos_ids, load_tokenizer

    folder = model_dir or cfg.model.path
    codec = HfCodec(load_tokenizer(folder), max_model_len=cfg.model.max_model_len, eos_ids=eos_ids(folder),
                    chat_template_kwargs=cfg.model.chat_template_kwargs)
    if cfg.kind == SINGLE_TURN:  # no search tool: a completion that writes </search> goes on to its end of turn
        codec.stop_strings = ()
    return codec
