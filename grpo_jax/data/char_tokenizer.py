"""A character-level tokenizer for the tiny quickstart models: no download, 100-odd ids.

Same interface as grpo_jax/tokenizer.py (encode / decode / eos_id / pad_id / bos_id / vocab_size).
Ids: 0 pad, 1 bos, 2 eos, then one id per character of `CHARS`. Characters outside `CHARS` are an
error on encode (a silent unknown token would hide a task/tokenizer mismatch).
"""

import string

CHARS = string.digits + string.ascii_letters + " +-*/=().,?!:;'\"<>[]{}#$%\\^_\n"
SPECIALS = ("<pad>", "<bos>", "<eos>")


class CharTokenizer:
    pad_id, bos_id, eos_id = 0, 1, 2
    vocab_size = len(SPECIALS) + len(CHARS)

    def __init__(self):
        self._ids = {c: i for i, c in enumerate(CHARS, len(SPECIALS))}

    def encode(self, text: str, continuation: bool = False) -> list[int]:
        """Ids of `text`, with bos first unless it continues a sequence (`continuation=True`)."""
        unknown = sorted(set(text) - self._ids.keys())
        if unknown:
            raise ValueError(f"CharTokenizer cannot encode {unknown}; it knows only {CHARS!r}")
        return [self.bos_id] * (not continuation) + [self._ids[c] for c in text]

    def decode(self, ids) -> str:
        """Text of `ids`; special ids are dropped."""
        return "".join(CHARS[i - len(SPECIALS)] for i in map(int, ids) if i >= len(SPECIALS))
