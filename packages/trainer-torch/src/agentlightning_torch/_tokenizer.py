"""A hand-made character-level tokenizer: one token per character of the calculator task's alphabet."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from pathlib import Path

__all__ = ["CALC_ALPHABET", "TOKENIZER_FILE", "CharTokenizer"]

CALC_ALPHABET = "0123456789+-*()=:\nQACLRE"
"""Every character the calculator task uses: digits, operators, brackets, separators and the tag letters."""

TOKENIZER_FILE = "char_tokenizer.json"
"""File name the tokenizer is saved under, next to the model (not ``tokenizer.json``, which is Hugging Face's)."""

_SPECIALS = ("<pad>", "<eos>", "<bos>")


class CharTokenizer:
    """Maps each character of a fixed alphabet to one token id; ids 0, 1, 2 are pad, eos and bos.

    Args:
        alphabet: The characters, in id order after the special tokens. Must not repeat a character.

    Raises:
        ValueError: If the alphabet is empty or repeats a character.
    """

    pad_token = "<pad>"
    eos_token = "<eos>"
    bos_token = "<bos>"

    def __init__(self, alphabet: str = CALC_ALPHABET) -> None:
        if not alphabet:
            raise ValueError("the alphabet must contain at least one character")
        repeated = sorted({c for c in alphabet if alphabet.count(c) > 1})
        if repeated:
            raise ValueError(f"the alphabet repeats characters: {repeated!r}")
        self.alphabet = alphabet
        self._char_to_id = {c: i + len(_SPECIALS) for i, c in enumerate(alphabet)}
        self._id_to_token = [*_SPECIALS, *alphabet]

    @property
    def pad_token_id(self) -> int:
        """Id of the padding token (0)."""
        return 0

    @property
    def eos_token_id(self) -> int:
        """Id of the end-of-sequence token (1)."""
        return 1

    @property
    def bos_token_id(self) -> int:
        """Id of the beginning-of-sequence token (2)."""
        return 2

    @property
    def special_ids(self) -> frozenset[int]:
        """Ids of pad, eos and bos."""
        return frozenset(range(len(_SPECIALS)))

    @property
    def vocab_size(self) -> int:
        """Number of token ids (special tokens included)."""
        return len(self._id_to_token)

    def __len__(self) -> int:
        return self.vocab_size

    def encode(self, text: str, *, add_bos: bool = False, add_eos: bool = False) -> list[int]:
        """Turn text into token ids, one per character.

        Raises:
            ValueError: If a character is outside the alphabet (the message names it and its position).
        """
        ids: list[int] = [self.bos_token_id] if add_bos else []
        for position, char in enumerate(text):
            token = self._char_to_id.get(char)
            if token is None:
                raise ValueError(
                    f"character {char!r} at position {position} of {text[:40]!r} is not in the tokenizer's "
                    f"alphabet {self.alphabet!r}"
                )
            ids.append(token)
        if add_eos:
            ids.append(self.eos_token_id)
        return ids

    def decode(self, ids: Iterable[int], *, skip_special_tokens: bool = True) -> str:
        """Turn token ids back into text; special tokens are dropped unless ``skip_special_tokens`` is False.

        Raises:
            ValueError: If an id is outside the vocabulary.
        """
        parts: list[str] = []
        for token in ids:
            if not 0 <= token < self.vocab_size:
                raise ValueError(f"token id {token} is outside the vocabulary (size {self.vocab_size})")
            if token < len(_SPECIALS) and skip_special_tokens:
                continue
            parts.append(self._id_to_token[token])
        return "".join(parts)

    def convert_ids_to_tokens(self, ids: Sequence[int]) -> list[str]:
        """The token string of each id (special tokens by name, e.g. ``<eos>``)."""
        return [self._id_to_token[i] for i in ids]

    def can_encode(self, text: str) -> bool:
        """Whether every character of ``text`` is in the alphabet."""
        return all(c in self._char_to_id for c in text)

    def save_pretrained(self, directory: str | Path) -> Path:
        """Write the tokenizer as JSON (``char_tokenizer.json``) into ``directory``; returns the file path."""
        path = Path(directory)
        path.mkdir(parents=True, exist_ok=True)
        target = path / TOKENIZER_FILE
        payload = {"type": "agentlightning-char", "version": 1, "specials": list(_SPECIALS), "alphabet": self.alphabet}
        target.write_text(json.dumps(payload, indent=2) + "\n", encoding="utf-8")
        return target

    @classmethod
    def from_pretrained(cls, directory: str | Path) -> CharTokenizer:
        """Load a tokenizer saved by `save_pretrained`.

        Raises:
            FileNotFoundError: If ``directory`` has no ``char_tokenizer.json``.
            ValueError: If the file is not a character tokenizer of this kind.
        """
        target = Path(directory) / TOKENIZER_FILE
        if not target.is_file():
            raise FileNotFoundError(f"no {TOKENIZER_FILE} in {directory}")
        payload = json.loads(target.read_text(encoding="utf-8"))
        if payload.get("type") != "agentlightning-char" or payload.get("specials") != list(_SPECIALS):
            raise ValueError(f"{target} is not an agentlightning character tokenizer")
        return cls(str(payload["alphabet"]))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, CharTokenizer) and other.alphabet == self.alphabet

    def __hash__(self) -> int:
        return hash(self.alphabet)

    def __repr__(self) -> str:
        return f"CharTokenizer(vocab_size={self.vocab_size})"
