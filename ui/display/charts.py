"""Plotly figures from stored metric points. One function per chart; each takes a list of (label, points)
series so the Write tab (one run) and the Compare tab (overlaid runs) share them.

The timer redraws them while a draft runs, so they must be cheap: figures are built from plain dicts with
plotly's validation off (25x faster than graph_objects with validation; the dicts below are checked once,
in the tests), every trace is thinned to MAX_POINTS, and one `uirevision` keeps a zoom across redraws.
"""

from __future__ import annotations

import plotly.graph_objects as go

from storage.records import MetricPoint

MAX_POINTS = 400
LEGEND_PX = 40  # room under the plot for the legend
COLORS = ("#4f46e5", "#d97706", "#059669", "#db2777", "#6b7280", "#0891b2")
GRID = "#e5e7eb"
Series = list[tuple[str, list[MetricPoint]]]


def thin(points: list[MetricPoint], limit: int = MAX_POINTS) -> list[MetricPoint]:
    """Every n-th point, always keeping the last one (the current value)."""
    if len(points) <= limit:
        return points
    step = len(points) / (limit - 1)
    return [points[int(i * step)] for i in range(limit - 1)] + [points[-1]]


def _axis(title: str, **extra) -> dict:
    return {"title": {"text": title}, "gridcolor": GRID, "zerolinecolor": "#9ca3af", "linecolor": GRID, **extra}


def _figure(title: str, y_title: str, traces: list[dict], *, legend: bool = False, **layout) -> go.Figure:
    empty = not any(len(t["x"]) for t in traces)
    base = {
        "title": {"text": title, "font": {"size": 14}, "x": 0.02}, "height": 250 + LEGEND_PX * legend,
        "uirevision": "keep", "margin": {"l": 55, "r": 20, "t": 40, "b": 40 + LEGEND_PX * legend},
        "hovermode": "x unified", "showlegend": legend and not empty,
        "paper_bgcolor": "white", "plot_bgcolor": "white", "font": {"family": "sans-serif", "color": "#374151"},
        # Below the axis title: above the plot, a legend of several runs ran into the chart's title.
        "legend": {"orientation": "h", "y": -0.3, "yanchor": "top", "x": 0, "xanchor": "left"},
        # From 0: a first point alone (at 25 tokens) got ticks at 25, 25.5, 26 on an axis of whole tokens.
        "xaxis": _axis("generated tokens", rangemode="tozero"), "yaxis": _axis(y_title),
        **layout,
    }
    for axis in ("xaxis", "yaxis", "yaxis2"):
        if axis in base:
            base[axis] = {**base[axis], "visible": not empty}
    if empty:
        base["annotations"] = [{"text": "waiting for the first tokens…", "showarrow": False, "xref": "paper",
                                "yref": "paper", "x": 0.5, "y": 0.5, "font": {"color": "#9ca3af"}}]
    return go.Figure({"data": traces, "layout": base}, _validate=False)


def _line(i: int, label: str, xs: list, ys: list, **style) -> dict:
    line = {"color": COLORS[i % len(COLORS)], "width": 2, **style}
    mode = "lines" if len(xs) > 12 else "lines+markers"  # a short run may have a single point: show it
    return {"type": "scatter", "mode": mode, "name": label, "x": xs, "y": ys, "line": line, "marker": {"size": 6}}


def _series(series: Series, field: str, *, hover: str, **style) -> list[dict]:
    traces = []
    for i, (label, points) in enumerate(series):
        pts = [p for p in thin(points) if getattr(p, field) is not None]
        line = _line(i, label, [p.tokens for p in pts], [getattr(p, field) for p in pts], **style)
        traces.append({**line, "hovertemplate": hover})
    return traces


# Hover text says what each value means, for a reader who has not read the paper.
ALPHA_HOVER = "%{y:.0%} of guessed tokens accepted (α)<extra>after %{x:,} tokens</extra>"
BETA_HOVER = "%{y:.0%} of guesses kept came from phrases already in the text (β)<extra>after %{x:,} tokens</extra>"
HITS_HOVER = "%{y:.0f} of every 1,000 tokens were guessed from earlier text<extra>after %{x:,} tokens</extra>"
SPEED_HOVER = "%{y:.1f} tokens/s<extra>after %{x:,} tokens</extra>"
SAVED_HOVER = ("%{y:.1f} s saved against plain decoding (below 0: TokenSwift cost time)"
               "<extra>after %{x:,} tokens</extra>")


def alpha_chart(series: Series) -> go.Figure:
    return _figure("Guesses accepted", "share accepted", _series(series, "alpha", hover=ALPHA_HOVER),
                   legend=len(series) > 1, yaxis=_axis("share accepted", rangemode="tozero", tickformat=".0%"))


def ngram_chart(series: Series) -> go.Figure:
    """β (share of accepted guesses that came from n-grams of the text so far) and such tokens per 1K."""
    traces = _series(series, "beta", hover=BETA_HOVER)
    for i, (label, points) in enumerate(series):
        traces[i]["name"] = f"share of guesses {label}".strip()
        xs, rates = hits_per_1k(thin(points))
        traces.append({**_line(i, f"per 1K tokens {label}".strip(), xs, rates, dash="dot", width=1.5),
                       "yaxis": "y2", "hovertemplate": HITS_HOVER})
    return _figure("Reused from the text so far", "share of guesses", traces, legend=True,
                   margin={"l": 55, "r": 55, "t": 40, "b": 40 + LEGEND_PX},
                   yaxis=_axis("share of guesses", rangemode="tozero", tickformat=".0%"),
                   yaxis2=_axis("tokens per 1K", overlaying="y", side="right", rangemode="tozero", showgrid=False))


def hits_per_1k(points: list[MetricPoint]) -> tuple[list[int], list[float]]:
    """Tokens taken from n-gram guesses per 1K generated, between consecutive points. A resumed run restarts
    the engine's counter: a drop means a new base, not negative hits."""
    xs, rates = [], []
    for before, after in zip(points, points[1:], strict=False):
        if after.ngram_hits is None or before.ngram_hits is None or after.tokens <= before.tokens:
            continue
        hits = after.ngram_hits - before.ngram_hits
        hits = after.ngram_hits if hits < 0 else hits
        xs.append(after.tokens)
        rates.append(1000 * hits / (after.tokens - before.tokens))
    return xs, rates


def speed_chart(series: Series) -> go.Figure:
    return _figure("Speed", "tokens/s", _series(series, "tokens_per_s", hover=SPEED_HOVER), legend=len(series) > 1,
                   yaxis=_axis("tokens/s", rangemode="tozero"))


def saved_chart(series: Series) -> go.Figure:
    return _figure("Time saved against plain decoding", "seconds",
                   _series(series, "time_saved_s", hover=SAVED_HOVER), legend=len(series) > 1)
