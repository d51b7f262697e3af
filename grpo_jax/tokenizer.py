"""One small tokenizer interface over a Hugging Face tokenizer directory or a sentencepiece model.

`encode` follows each tokenizer's own convention: a Hugging Face tokenizer adds the special tokens
its post-processor adds (Llama: BOS; Qwen: none), unless the text already starts with BOS (a chat
template wrote it), so BOS is never dropped and never doubled; a sentencepiece model adds none (its
encoder's default). `encode(text, continuation=True)` is for text that continues a sequence (a
supervised completion target): no special token is added. `decode` drops special tokens (rewards read
text).
A tokenizer without a pad token pads with its end-of-sequence id. `apply_chat_template(messages)`
(list of {"role", "content"} -> prompt text ending with the assistant turn opener) is None when the
tokenizer has no chat template.
"""

import pathlib
from collections.abc import Callable, Sequence
from typing import Protocol, runtime_checkable

import numpy as np
from jaxtyping import Int

ChatTemplate = Callable[[list[dict[str, str]]], str]
TokenIds = Sequence[int] | Int[np.ndarray, " n"]  # a list, or a row of a rollout's token array


@runtime_checkable  # so that a checker can test what `load` returns
class Tokenizer(Protocol):
    eos_id: int
    pad_id: int
    vocab_size: int
    apply_chat_template: ChatTemplate | None

    def encode(self, text: str, continuation: bool = False) -> list[int]: ...

    def decode(self, ids: TokenIds) -> str: ...


class HFTokenizer:
    """A `transformers` tokenizer loaded from a local directory."""

    def __init__(self, path: pathlib.Path):
        import transformers

        self._tok = transformers.AutoTokenizer.from_pretrained(str(path))
        if self._tok.eos_token_id is None:
            raise ValueError(f"{path}: the tokenizer defines no eos_token; set it in tokenizer_config.json")
        self.eos_id = self._tok.eos_token_id
        self.pad_id = self._tok.pad_token_id if self._tok.pad_token_id is not None else self.eos_id
        self.vocab_size = len(self._tok)
        self.apply_chat_template = self._chat if self._tok.chat_template is not None else None

    def encode(self, text: str, continuation: bool = False) -> list[int]:
        bos = self._tok.bos_token
        return self._tok.encode(text, add_special_tokens=not (continuation or (bos and text.startswith(bos))))

    def decode(self, ids: TokenIds) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=True)

    def _chat(self, messages: list[dict[str, str]]) -> str:
        return self._tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


class SentencePieceTokenizer:
    """A sentencepiece `.model` file (no chat template)."""

    apply_chat_template = None

    def __init__(self, path: pathlib.Path):
        import sentencepiece

        self._sp = sentencepiece.SentencePieceProcessor(model_file=str(path))
        if self._sp.eos_id() < 0:
            raise ValueError(f"{path}: the sentencepiece model defines no eos piece (eos_id = -1)")
        self.eos_id = self._sp.eos_id()
        self.pad_id = self._sp.pad_id() if self._sp.pad_id() >= 0 else self.eos_id
        self.vocab_size = self._sp.get_piece_size()

    def encode(self, text: str, continuation: bool = False) -> list[int]:
        return self._sp.encode(text)  # adds no special token, at the start of a sequence or not

    def decode(self, ids: TokenIds) -> str:
        return self._sp.decode([int(i) for i in ids])


def load(path: str | pathlib.Path) -> Tokenizer:
    """A HF tokenizer directory (tokenizer.json / tokenizer_config.json) or a sentencepiece .model file."""
    path = pathlib.Path(path)
    if path.is_file() and path.suffix == ".model":
        return SentencePieceTokenizer(path)
    if path.is_dir() and any((path / f).exists() for f in ("tokenizer.json", "tokenizer_config.json")):
        return HFTokenizer(path)
    raise FileNotFoundError(
        f"{path}: expected a Hugging Face tokenizer directory (with tokenizer.json or "
        "tokenizer_config.json) or a sentencepiece .model file"
    )
