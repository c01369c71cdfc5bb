"""Training text for the draft heads: read documents, tokenise them, keep each one's opening, pack.

Files: `.txt` (the whole file is one document), `.jsonl` and `.jsonl.xz` (one JSON object per line, the
document in its `text` field, as in shared/data/books). Packing concatenates the kept tokens of every
document and cuts the stream into sequences of `seq_len` tokens. With documents at least `doc_tokens` =
`seq_len` long (the paper: the first 8K tokens of each PG-19 book) every sequence is one book's opening.
"""

from __future__ import annotations

import json
import lzma
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

EXTENSIONS = (".txt", ".jsonl", ".jsonl.xz")
SPARE_TOKENS = 16  # tokens past the cut that a prefix must yield, so the kept ones cannot change


class DataError(ValueError):
    """Unusable training or evaluation text; the message names the file."""


@dataclass
class Packed:
    tokens: torch.Tensor  # [sequences, seq_len] int64
    documents: int  # documents that contributed tokens
    total_tokens: int  # kept tokens before cutting into sequences (the tail shorter than seq_len is dropped)

    def describe(self) -> dict:
        n, length = self.tokens.shape
        return {"documents": self.documents, "tokens": self.total_tokens, "sequences": n, "seq_len": length}


def read_documents(paths: Sequence[str | Path], max_docs: int | None = None) -> list[str]:
    """The non-empty documents of every file, in order; at most max_docs in all."""
    docs: list[str] = []
    for path in map(Path, paths):
        found = 0
        for text in _file_documents(path):
            if text.strip():
                docs.append(text)
                found += 1
            if max_docs is not None and len(docs) >= max_docs:
                return docs  # stop reading: a large .jsonl.xz need not be decompressed to the end
        if not found:
            raise DataError(f"{path}: no text (the file or every document in it is empty)")
    return docs


def _file_documents(path: Path) -> Iterator[str]:
    name = path.name.lower()
    if not name.endswith(EXTENSIONS):
        raise DataError(f"{path}: unknown file type; use one of {', '.join(EXTENSIONS)}")
    if not path.is_file():
        raise DataError(f"{path}: no such file")
    if name.endswith(".txt"):
        yield path.read_text(encoding="utf-8")
        return
    opener = lzma.open if name.endswith(".xz") else open
    try:
        with opener(path, "rt", encoding="utf-8") as lines:
            for number, line in enumerate(lines, 1):
                if line.strip():
                    yield _jsonl_text(path, number, line)
    except lzma.LZMAError as error:
        raise DataError(f"{path}: not a valid .xz file ({error})") from error


def _jsonl_text(path: Path, number: int, line: str) -> str:
    try:
        record = json.loads(line)
    except json.JSONDecodeError as error:
        raise DataError(f"{path}:{number}: not valid JSON ({error.msg})") from error
    if not isinstance(record, dict) or not isinstance(record.get("text"), str):
        raise DataError(f"{path}:{number}: each line must be a JSON object with a string field `text`")
    return record["text"]


def opening_tokens(text: str, encode: Callable[[str], list[int]], n: int | None) -> list[int]:
    """The first n tokens of text (all when n is None), tokenising only a prefix of a long book."""
    if n is None:
        return encode(text)
    chars = 8 * (n + SPARE_TOKENS)  # tokens rarely span more than 8 characters; grow if they do
    while True:
        ids = encode(text[:chars])
        if len(ids) >= n + SPARE_TOKENS or chars >= len(text):
            return ids[:n]
        chars *= 2


def pack(docs: Sequence[Sequence[int]], seq_len: int, source: str = "the data") -> Packed:
    stream = [t for doc in docs for t in doc]
    if len(stream) < seq_len:
        raise DataError(f"{source}: {len(stream)} tokens in {len(docs)} documents, fewer than one sequence "
                        f"of {seq_len}; give more text or a smaller --seq-len")
    n = len(stream) // seq_len
    tokens = torch.tensor(stream[: n * seq_len], dtype=torch.int64).view(n, seq_len)
    return Packed(tokens, sum(1 for d in docs if d), len(stream))


def load_sequences(paths: Sequence[str | Path], encode: Callable[[str], list[int]], seq_len: int,
                   doc_tokens: int | None = None, max_docs: int | None = None) -> Packed:
    """Read, tokenise (the first doc_tokens of each document; None = whole documents) and pack."""
    if not paths:
        raise DataError("no data files given")
    docs = [opening_tokens(text, encode, doc_tokens) for text in read_documents(paths, max_docs)]
    return pack(docs, seq_len, ", ".join(map(str, paths)))
