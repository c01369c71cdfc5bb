"""Held-out acceptance of a draft layer: the points of its learning curve (train_draft.py).

Measured on stored teacher data of eval-split books, with the book's tokens as the accepted path (teacher
forcing), for each depth of a drafted chain: how often the draft's guess is the token the model itself would
choose there, greedily and at T=1 with min-p (both drawing with the same noise, as the engine does).
"""

from __future__ import annotations

import math

import torch

from tokenswift.model.draft_layer import DraftLayer
from tokenswift.sampling.sampler import apply_penalty
from tokenswift.train.draft_loss import Penalty, distill_loss, penalised_targets, soft_targets, unrolled_states


@torch.no_grad()
def evaluate(layer: DraftLayer, embed, head_rows: torch.Tensor, rows: dict[str, torch.Tensor], rope, depth: int,
             to_draft: torch.Tensor, min_p: float = 0.1, seed: int = 0, chunk: int = 8,
             penalty: Penalty | None = None, final_norm=None) -> dict:
    """Held-out acceptance per chain depth, with the book's tokens as the accepted path (teacher forcing).

    greedy: the draft's top-1 is the model's top-1. T=1 (min-p): both choose with the same Gumbel noise over
    their min-p-filtered distributions (as the engine draws and ranks drafts); accepted when they agree.
    greedy_penalised (with a penalty and the model's final norm): the draft's top-1 under the penalty of each
    row's window is the model's, both over the draft vocabulary (the model's choices outside it, ~2%, count as
    agreed when the draft's matches its best inside): what greedy drafting meets in the app, slightly high.
    tokens/step: 1 + a1 + a1·a2 + ... (a chain of `depth`), treating depths as independent."""
    generator = torch.Generator().manual_seed(seed)
    vocab = layer.vocab
    agree = torch.zeros(3, depth)
    counted = torch.zeros(depth)
    loss_sum = 0.0
    n = rows["tokens"].shape[0]
    for start in range(0, n, chunk):
        batch = {k: v[start:start + chunk].to(head_rows.device) for k, v in rows.items()}
        states = unrolled_states(layer, embed, batch, rope, depth)
        ids, probs = soft_targets(batch, to_draft)
        teacher_top = batch["top_ids"][:, 1:, 0]
        t_logp = batch["top_logp"][:, 1:].float()
        t_ids = batch["top_ids"][:, 1:]
        if penalty is not None:
            probs_p, mask = penalised_targets(batch, final_norm, head_rows, to_draft, penalty)
            model_top_p = probs_p.argmax(-1)
        for s, st in enumerate(states):
            logits = layer.logits(st, head_rows).float()
            if s == 0:
                loss_sum += float(distill_loss(logits, ids, probs, 0)) * len(st)
            sl = slice(s, None)
            draft_top = vocab[logits[:, sl].argmax(-1)]
            agree[0, s] += float((draft_top == teacher_top[:, sl]).sum())
            agree[1, s] += float(_noisy_agreement(logits[:, sl], vocab, to_draft, t_logp[:, sl], t_ids[:, sl], min_p,
                                                  generator))
            if penalty is not None:
                mine = apply_penalty(logits[:, sl], mask[:, sl], penalty.theta).argmax(-1)
                agree[2, s] += float((mine == model_top_p[:, sl]).sum())
            counted[s] += draft_top.numel()
    rates = agree / counted
    out = {"greedy": rates[0].tolist(), "t1": rates[1].tolist(), "loss": loss_sum / n}
    if penalty is not None:
        out["greedy_penalised"] = rates[2].tolist()
    for name in [k for k in ("greedy", "t1", "greedy_penalised") if k in out]:
        tau, run = 1.0, 1.0
        for a in out[name]:
            run *= a
            tau += run
        out[f"tokens_per_step_{name}"] = tau
    return out


def _noisy_agreement(logits, vocab, to_draft, t_logp, t_ids, min_p, generator) -> torch.Tensor:
    """Rows where argmax(min-p(draft) + g) == argmax(min-p(model) + g), with g one Gumbel draw per token id and
    row: drawn over the draft vocabulary, and apart for the model's guesses outside it."""
    g = _gumbel(logits.shape, generator).to(logits.device)
    logq = torch.log_softmax(logits, -1)
    logq = logq.masked_fill(logq < logq.max(-1, keepdim=True).values + math.log(min_p), -math.inf)
    draft = vocab[(logq + g).argmax(-1)]
    inside = to_draft[t_ids]
    g_model = torch.where(inside >= 0, g.gather(-1, inside.clamp_min(0)),
                          _gumbel(t_ids.shape, generator).to(logits.device))
    logp = t_logp.masked_fill(t_logp < t_logp[..., :1] + math.log(min_p), -math.inf)
    model = t_ids.gather(-1, (logp + g_model).argmax(-1, keepdim=True))[..., 0]
    return (draft == model).sum()


def _gumbel(shape, generator) -> torch.Tensor:
    return -torch.log(-torch.log(torch.rand(shape, generator=generator).clamp(1e-12, 1 - 1e-7)))


def print_curve(curve: list) -> None:
    """The curve as a table; the penalised column is blank for points measured before it existed."""
    print(f"{'tokens':>10} {'unique':>10} | {'greedy a1/a2/a3':>17} {'tok/step':>8} | {'T=1 a1/a2/a3':>17} "
          f"{'tok/step':>8} | {'θ greedy a1/a2/a3':>17} {'tok/step':>8} | {'loss':>6}")
    for p in curve:
        columns = []
        for name in ("greedy", "t1", "greedy_penalised"):
            rates, tau = p.get(name), p.get(f"tokens_per_step_{name}")
            columns.append(f"{' '.join(f'{a:.3f}' for a in rates):>17} {tau:>8.3f}" if rates else f"{'':>26}")
        print(f"{p['tokens']:>10,} {p['unique_tokens']:>10,} | {' | '.join(columns)} | {p['loss']:>6.3f}")


def point_line(p: dict) -> str:
    line = (f"{p['tokens']:,} tokens: greedy {' / '.join(f'{a:.3f}' for a in p['greedy'])} "
            f"({p['tokens_per_step_greedy']:.2f} tok/step), T=1 {' / '.join(f'{a:.3f}' for a in p['t1'])} "
            f"({p['tokens_per_step_t1']:.2f} tok/step)")
    if "greedy_penalised" in p:
        line += (f", penalised greedy {' / '.join(f'{a:.3f}' for a in p['greedy_penalised'])} "
                 f"({p['tokens_per_step_greedy_penalised']:.2f} tok/step)")
    return line + f", loss {p['loss']:.3f}"
