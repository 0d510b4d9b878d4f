"""Plotly figures for the Compare page (pure functions of tidy frames; no Streamlit).

The PI widths are those of the test points, ``2 z sqrt(var_y)`` (ALGORITHMS.md 7.3), in the
space the models train in; the strata come from each run's test predictions.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from app.safe_html import html_text
from gpcore import metrics as M

STRATUM_COLORS = {"metro": "#d62728", "urban": "#d62728", "non-metro": "#1f77b4", "rural": "#1f77b4",
                  "unknown": "#7f7f7f", "all": "#21918c"}
#: Legend names of the strata: metro / non-metro counties are the urban / rural split (ALGORITHMS.md 7.4).
DISPLAY = {"metro": "metro (urban)", "non-metro": "non-metro (rural)"}
LAYOUT = dict(margin=dict(l=10, r=10, t=30, b=10), height=380, legend=dict(orientation="h", y=1.08, x=0))


def _color(label: str, i: int) -> str:
    palette = ["#d62728", "#1f77b4", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#bcbd22", "#17becf"]
    return STRATUM_COLORS.get(str(label).lower(), palette[i % len(palette)])


def test_widths(test: pd.DataFrame) -> pd.Series:
    """Per-point 95 % interval width ``2 z sqrt(var_y)`` of test predictions."""
    return pd.Series(M.interval_width(test["var_y"].to_numpy()), index=test.index)


def width_violins(test: pd.DataFrame, units: str = "") -> go.Figure:
    """Violins of the 95 % PI widths per model, split by stratum (urban / rural = metro / non-metro)."""
    df = test.assign(width=test_widths(test), stratum=test.get("stratum", "all"))
    strata = [s for s in ("metro", "urban", "non-metro", "rural") if s in set(df["stratum"])]
    strata += sorted(s for s in df["stratum"].unique() if s not in strata and s != "unknown")
    if len(strata) == 0:
        strata = ["all"]
        df = df.assign(stratum="all")
    fig = go.Figure()
    two = len(strata) == 2
    for i, s in enumerate(strata):
        part = df[df["stratum"] == s]
        fig.add_trace(
            go.Violin(
                x=part["model"], y=part["width"], name=html_text(DISPLAY.get(str(s), str(s))), legendgroup=str(s),
                scalegroup=str(s),
                side=("negative" if i == 0 else "positive") if two else None,
                line_color=_color(s, i), meanline_visible=True, points=False, spanmode="hard",
            )
        )
    fig.update_layout(violinmode="overlay" if two else "group", violingap=0.15,
                      yaxis_title=f"95% PI width ({units})" if units else "95% PI width", **LAYOUT)
    return fig


def coverage_bars(metrics: pd.DataFrame, target: float = 0.95) -> go.Figure:
    """Coverage of the 95 % interval per model and stratum, with the target line."""
    fig = go.Figure()
    groups = [g for g in metrics["group"].unique() if g != "unknown"]
    for i, g in enumerate(groups):
        part = metrics[metrics["group"] == g]
        fig.add_trace(go.Bar(x=part["model"], y=part["coverage"], name=html_text(DISPLAY.get(str(g), str(g))),
                             marker_color=_color(g, i),
                             text=[f"{100 * v:.1f}%" for v in part["coverage"]], textposition="outside"))
    fig.add_hline(y=target, line_dash="dash", line_color="black", annotation_text="95% target",
                  annotation_position="bottom right")
    lo = float(np.nanmin(metrics["coverage"])) if len(metrics) else 0.8
    yaxis = dict(title="coverage", tickformat=".0%", range=[min(lo - 0.05, 0.85), 1.02])
    fig.update_layout(barmode="group", yaxis=yaxis, **LAYOUT)
    return fig


def calibration(test: pd.DataFrame) -> go.Figure:
    """Observed coverage against nominal level per model (the diagonal is perfect calibration)."""
    fig = go.Figure()
    fig.add_trace(go.Scatter(x=[0, 1], y=[0, 1], mode="lines", name="ideal", line=dict(color="gray", dash="dot")))
    levels = np.array([0.05, *M.CALIBRATION_LEVELS])
    for model, part in test.groupby("model", sort=False):
        cc = M.calibration_curve(part["mean"], part["var_y"], part["y"], levels=tuple(levels))
        fig.add_trace(go.Scatter(x=cc["nominal"], y=cc["observed"], mode="lines+markers", name=str(model)))
    fig.update_layout(xaxis=dict(title="nominal coverage", tickformat=".0%", range=[0, 1]),
                      yaxis=dict(title="observed coverage", tickformat=".0%", range=[0, 1]), **LAYOUT)
    return fig


def timings(overall: pd.DataFrame) -> go.Figure:
    fig = go.Figure()
    for col, name, color in (("fit_seconds", "fit", "#21918c"), ("predict_seconds", "predict (test split)", "#fde725")):
        if col in overall:
            fig.add_trace(go.Bar(x=overall["model"], y=overall[col], name=name, marker_color=color,
                                 text=[f"{v:.2f} s" for v in overall[col]], textposition="outside"))
    fig.update_layout(barmode="group", yaxis_title="seconds", **LAYOUT)
    return fig


def format_metrics(df: pd.DataFrame) -> pd.DataFrame:
    """Rounded copy for display (coverage as a percentage)."""
    out = df.copy()
    for col in ("mae", "rmse", "nll", "crps", "pi_width_mean", "pi_width_median"):
        if col in out:
            out[col] = out[col].map(lambda v: f"{v:.4f}")
    if "coverage" in out:
        out["coverage"] = out["coverage"].map(lambda v: f"{100 * v:.1f}%")
    for col in ("fit_seconds", "predict_seconds"):
        if col in out:
            out[col] = out[col].map(lambda v: f"{v:.2f}")
    return out
