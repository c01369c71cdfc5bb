"""Self-distillation: the model first writes its own training text by plain sampling (train-heads --self-distill)."""

from __future__ import annotations

import json
from pathlib import Path

from tqdm import tqdm

from tokenswift.model.loading import LoadedModel
from tokenswift.train.head_config import DistillConfig


def self_distill(lm: LoadedModel, dc: DistillConfig, prompts: list[list[int]], sample_tokens: int,
                 seed: int, progress: bool = True) -> list[list[int]]:
    """Documents (prompt + sample) of plain decoding, dc.tokens generated tokens in all. Sample k uses
    prompt k mod len(prompts) and seed + k: sampling noise is keyed by seed and position, so one seed
    would repeat the same text."""
    from tokenswift.decode.generate import Generator
    from tokenswift.decode.options import EngineOptions
    from tokenswift.settings import PLAIN, Settings

    docs, made = [], 0
    with tqdm(total=dc.tokens, desc="self-distill", unit="tok", disable=not progress) as bar:
        while made < dc.tokens:
            k = len(docs)
            settings = Settings(seed=seed + k, max_new_tokens=min(sample_tokens, dc.tokens - made),
                                temperature=dc.temperature, top_p=dc.top_p, min_p=dc.min_p,
                                penalty=dc.penalty, penalty_window=dc.penalty_length)
            prompt = prompts[k % len(prompts)]
            gen = Generator(lm, settings, prompt, options=EngineOptions(speculation=PLAIN))
            ids = gen.run(lambda new: bar.update(len(new)))
            docs.append(prompt + ids)
            made += len(ids)
    return docs


def write_distilled(path: Path, docs: list[list[int]], lm: LoadedModel) -> None:
    """One JSON line per sample: the ids we train on, and the text, so the file also serves as --data."""
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = (json.dumps({"text": lm.decode(d), "ids": d}, ensure_ascii=False) for d in docs)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
