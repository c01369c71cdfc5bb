"""bench-gpu's printed report: the full table per model and context, and the short summary a device run prints last
(the numbers: bench/gpu.py's result dict)."""

from __future__ import annotations

import math


def _fmt(value, spec: str = ".2f", width: int = 8) -> str:
    if isinstance(value, float):
        return f"{value:{width}{spec}}"
    return f"{'-' if value is None else 'err':>{width}}"


def table(out: dict) -> str:
    lines = [f"bench-gpu on {out['device']} (torch {out['torch']})"
             + (f", device copy {out['copy_bandwidth_gb_s']:.0f} GB/s" if out["copy_bandwidth_gb_s"] else "")]
    for m in out["models"]:
        labels = [s["label"] for s in m["shapes"]]
        lines.append("")
        lines.append(f"{m['name']} ({m['dtype']}, {_count(m['parameters'])} params, weights "
                     f"{m['weight_bytes'] / 1e9:.2f} GB read per token, KV {m['kv_bytes_per_token'] / 1024:.0f} "
                     f"KiB/token, draft heads {m['heads']}, |B|={m['budget']})")
        head = (f"{'context':>8} {'kernel':>9} {'AR ms':>8} {'tok/s':>8} {'GB/s':>8} {'of copy':>8} {'fwd ms':>8}"
                f" {'draft':>8}")
        lines.append(head + "".join(f" {'v' + str(s['slots']):>8}" for s in m["shapes"]))
        for i, context in enumerate(m["contexts"]):
            for kind, kernel in m["kernels"].items():
                if kernel["error"] or len(kernel["rows"]) <= i:
                    lines.append(f"{context:>8} {kind:>9}  failed: {kernel['error']}")
                    continue
                r = kernel["rows"][i]
                frac = r.get("bandwidth_fraction")
                lines.append(f"{context:>8} {kind:>9} {_fmt(r['ar_ms'])} {_fmt(r.get('tokens_per_s'), '.1f')} "
                             f"{_fmt(r.get('bandwidth_gb_s'), '.0f')} "
                             f"{_fmt(100 * frac if frac is not None else None, '.1f', 7)}% "
                             f"{_fmt(r.get('forward_ms'))} {_fmt(r['draft_ms'])}"
                             + "".join(f" {_fmt(r['verify_ms'].get(label))}" for label in labels))
        errors = {f"{k}@{r['context']}": v for k, kern in m["kernels"].items() for r in kern["rows"]
                  for v in [r["ar_ms"], *r["verify_ms"].values()] if isinstance(v, str)}
        for where, error in list(errors.items())[:4]:
            lines.append(f"  error {where}: {error}")
        lines.extend(_projection_lines(m))
    return "\n".join(lines)


def _count(n: int) -> str:
    return f"{n / 1e9:.2f}B" if n >= 1e8 else f"{n / 1e6:.2f}M"


def _projection_lines(m: dict) -> list[str]:
    p, mem = m["projection"], m["memory"]
    lines = []
    if "ar_minutes" in p:
        line = (f"projection, {p['new_tokens']} tokens after a {p['prompt']}-token prompt (best kernel per pass): "
                f"AR {p['ar_minutes']:.1f} min")
        if "floor_minutes" in p:
            line += f" (bandwidth floor here {p['floor_minutes']:.1f})"
        if "tokenswift_minutes" in p:
            line += f", TokenSwift at {p['tokens_per_iter']:.2f} tokens/iter {p['tokenswift_minutes']:.1f} min"
        lines.append(line)
    if p.get("paper_a100_minutes"):
        ref = p["paper_a100_minutes"]
        line = f"  paper (A100, eager AR baseline): AR {ref['ar']:.0f} min, TokenSwift {ref['tokenswift']:.0f} min"
        if p.get("h100_floor_minutes"):
            line += f"; AR bandwidth floor on an H100 ~{p['h100_floor_minutes']:.1f} min"
        lines.append(line)
    if "peak_gb" in mem:
        verdict = "fits" if mem["fits_100k"] else "does NOT fit"
        lines.append(f"memory: peak {mem['peak_gb']:.1f} GB of {mem['device_gb']:.0f} GB; 100K context with full + "
                     f"partial caches {verdict} (weights {mem['weights_gb']:.1f} + caches "
                     f"{mem['full_cache_gb_100k'] + mem['partial_cache_gb']:.1f} + workspace "
                     f"{mem['workspace_gb']:.1f} GB)")
    return lines


def summary_rows(out: dict) -> list[str]:
    """One line per model and context with the best kernels: the short table a device run prints last."""
    lines = [f"{'model':<14}{'ctx':>7}{'AR tok/s':>10}{'of copy':>9}{'ar':>10}{'verify':>10}{'v121 ms':>9}"]
    for m in out["models"]:
        first = m["shapes"][0]["label"]
        for r in m["best"]:
            row = next((x for x in m["kernels"].get(r["ar_kernel"] or "", {}).get("rows", [])
                        if x["context"] == r["context"]), {})
            tps = 1e3 / r["ar_ms"] if r["ar_ms"] else None
            frac = row.get("bandwidth_fraction")
            lines.append(f"{m['name']:<14}{r['context']:>7}{_fmt(tps, '.1f', 10)}"
                         f"{_fmt(100 * frac if frac is not None else None, '.1f', 8)}%"
                         f"{r['ar_kernel'] or '-':>10}{r['verify_kernel'].get(first) or '-':>10}"
                         f"{_fmt(r['verify_ms'].get(first), '.2f', 9)}")
        p = m["projection"]
        if "ar_minutes" in p:
            lines.append(f"{'':<14}100K tokens: AR {p['ar_minutes']:.1f} min, TokenSwift "
                         f"{p.get('tokenswift_minutes', math.nan):.1f} min at {p['tokens_per_iter']} tok/iter")
    return lines
