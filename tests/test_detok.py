"""Streaming detokenization gives exactly the text of decoding everything at once."""

from __future__ import annotations

import pytest
from speed import AR

from tokenswift.text.detok import IncrementalDetokenizer

TEXT = "Once upon a time, “Lily” said: don't go — the café was closed.\n\nThe end. Ünïcödé ✓ 漢字"


def stream(tokenizer, ids, context, sizes):
    d = IncrementalDetokenizer(tokenizer, context)
    out, i = [], 0
    while i < len(ids):
        n = sizes[len(out) % len(sizes)]
        out.append(d.push(ids[i:i + n]))
        i += n
    return "".join(out) + d.flush()


def test_stream_equals_whole_decode(stories32):
    tok = stories32.tokenizer
    prompt = stories32.encode("The story begins.")
    ids = stories32.encode(TEXT)[1:]
    whole = tok.decode(prompt + ids, skip_special_tokens=True)
    head = tok.decode(prompt, skip_special_tokens=True)
    for sizes in ([1], [2, 3], [5, 1, 4]):
        assert head + stream(tok, ids, prompt, sizes) == whole


@pytest.mark.slow
def test_model_output_streams_exactly(stories32):
    from tokenswift.decode.generate import Generator
    from tokenswift.settings import Settings

    prompt = stories32.encode("Tom found a box")
    ids = Generator(stories32, Settings(max_new_tokens=300, seed=1, ignore_eos=True), prompt, options=AR).run()
    tok = stories32.tokenizer
    head = tok.decode(prompt, skip_special_tokens=True)
    assert head + stream(tok, ids, prompt, [1, 4, 2]) == tok.decode(prompt + ids, skip_special_tokens=True)
