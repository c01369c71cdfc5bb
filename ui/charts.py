"""Plotly figures from stored metric points. One function per chart; each takes a list of (label, points)
series so the Write tab (one run) and the Compare tab (overlaid runs) share them.

A 100K-token draft may have thousands of points: every trace is thinned to MAX_POINTS, and figures keep
one `uirevision` so a redraw does not reset a zoom the writer chose.
"""

from __future__ import annotations

import plotly.graph_objects as go

from storage.records import MetricPoint

MAX_POINTS = 400
COLORS = ("#4f46e5", "#d97706", "#059669", "#db2777", "#6b7280", "#0891b2")
Series = list[tuple[str, list[MetricPoint]]]


def thin(points: list[MetricPoint], limit: int = MAX_POINTS) -> list[MetricPoint]:
    """Every n-th point, always keeping the last one (the current value)."""
    if len(points) <= limit:
        return points
    step = len(points) / (limit - 1)
    return [points[int(i * step)] for i in range(limit - 1)] + [points[-1]]


def _figure(title: str, y_title: str, series: Series, note: str = "waiting for the first tokens…") -> go.Figure:
    fig = go.Figure()
    fig.update_layout(
        title={"text": title, "font": {"size": 14}, "x": 0.02}, height=250, template="plotly_white",
        margin={"l": 55, "r": 20, "t": 40, "b": 40}, uirevision="keep", hovermode="x unified",
        xaxis_title="generated tokens", yaxis_title=y_title, showlegend=len(series) > 1,
        legend={"orientation": "h", "y": 1.02, "yanchor": "bottom", "x": 1, "xanchor": "right"},
    )
    if not any(points for _, points in series):
        fig.add_annotation(text=note, showarrow=False, xref="paper", yref="paper", x=0.5, y=0.5,
                           font={"color": "#888"})
    return fig


def _line(fig: go.Figure, i: int, label: str, xs: list, ys: list, **style) -> None:
    fig.add_trace(go.Scatter(x=xs, y=ys, name=label, mode="lines", line={"color": COLORS[i % len(COLORS)],
                                                                         "width": 2, **style}))


def alpha_chart(series: Series) -> go.Figure:
    fig = _figure("Acceptance rate α", "α", series)
    for i, (label, points) in enumerate(series):
        pts = [p for p in thin(points) if p.alpha is not None]
        _line(fig, i, label, [p.tokens for p in pts], [p.alpha for p in pts])
    fig.update_yaxes(rangemode="tozero")
    return fig


def ngram_chart(series: Series) -> go.Figure:
    """β (share of accepted tokens that came from n-grams) and n-gram hits per 1K tokens."""
    fig = _figure("N-gram hits", "β", series)
    for i, (label, points) in enumerate(series):
        pts = [p for p in thin(points) if p.beta is not None]
        _line(fig, i, f"β {label}".strip(), [p.tokens for p in pts], [p.beta for p in pts])
        xs, rates = hits_per_1k(thin(points))
        fig.add_trace(go.Scatter(x=xs, y=rates, name=f"hits/1K {label}".strip(), mode="lines", yaxis="y2",
                                 line={"color": COLORS[i % len(COLORS)], "dash": "dot", "width": 1.5}))
    fig.update_layout(showlegend=True, yaxis={"rangemode": "tozero"},
                      yaxis2={"title": "hits per 1K tokens", "overlaying": "y", "side": "right",
                              "rangemode": "tozero", "showgrid": False})
    fig.update_layout(margin={"r": 55})
    return fig


def hits_per_1k(points: list[MetricPoint]) -> tuple[list[int], list[float]]:
    """Rate between consecutive points. A resumed run restarts the engine's counter: a drop means a new
    base, not negative hits."""
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
    fig = _figure("Speed", "tokens/s", series)
    for i, (label, points) in enumerate(series):
        pts = [p for p in thin(points) if p.tokens_per_s is not None]
        _line(fig, i, label, [p.tokens for p in pts], [p.tokens_per_s for p in pts])
    fig.update_yaxes(rangemode="tozero")
    return fig


def saved_chart(series: Series) -> go.Figure:
    fig = _figure("Time saved vs AR (cumulative)", "seconds", series)
    for i, (label, points) in enumerate(series):
        pts = [p for p in thin(points) if p.time_saved_s is not None]
        _line(fig, i, label, [p.tokens for p in pts], [p.time_saved_s for p in pts], shape="spline")
    return fig
