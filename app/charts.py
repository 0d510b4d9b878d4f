"""Plotly figures for the Compare page (pure functions of tidy frames; no Streamlit).

The PI widths are those of the test points, ``2 z sqrt(var_y)`` (docs/metrics.md §7.3), in the
space the models train in; the strata come from each run's test predictions.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from app.safe_html import html_text
from gpcore import metrics as M
from gpcore.models.noise_shape import of_rows

STRATUM_COLORS = {"metro": "#d62728", "urban": "#d62728", "non-metro": "#1f77b4", "rural": "#1f77b4",
                  "unknown": "#7f7f7f", "all": "#21918c"}
#: Colours of other strata, assigned in sorted order of their labels (so every chart agrees).
PALETTE = ["#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf", "#bcbd22", "#393b79"]
#: Legend names of the strata: metro / non-metro counties are the urban / rural split (docs/metrics.md §7.4).
DISPLAY = {"metro": "metro (urban)", "non-metro": "non-metro (rural)"}
LAYOUT = dict(margin=dict(l=10, r=10, t=30, b=10), height=380, legend=dict(orientation="h", y=1.1, x=0))
#: Chart toolbar: only what helps here (and nothing that covers the legend).
CONFIG = {"displaylogo": False, "modeBarButtonsToRemove": ["select2d", "lasso2d", "autoScale2d"]}


def stratum_colors(labels) -> dict[str, str]:
    """One colour per stratum label for every chart of a page: fixed for urban / rural names, else by sorted label."""
    out = {}
    others = sorted({str(v) for v in labels} - set(STRATUM_COLORS))
    for label in {str(v) for v in labels}:
        key = label.lower()
        out[label] = STRATUM_COLORS.get(key) or PALETTE[others.index(label) % len(PALETTE)]
    return out


def ordered_strata(labels) -> list[str]:
    """Urban before rural, then the rest sorted; ``unknown`` (points outside every stratum) left out."""
    labels = {str(v) for v in labels}
    first = [s for s in ("metro", "urban", "non-metro", "rural") if s in labels]
    return first + sorted(s for s in labels if s not in first and s not in ("unknown", "all"))


def test_widths(test: pd.DataFrame) -> pd.Series:
    """Per-point 95 % interval width of test predictions: ``2 z sqrt(var_y)``, or the skewed predictive's of a run
    with a noise shape (each model's rows with their own)."""
    key = test["model"].to_numpy() if "model" in test else np.zeros(len(test))
    out = np.full(len(test), np.nan)
    for rows in pd.Series(key).groupby(key, sort=False).indices.values():  # positions of each model's rows
        part = test.iloc[rows]
        shape = of_rows(part)
        var_f = part["var_f"].to_numpy(float) if shape is not None else None
        out[rows] = M.interval_width(part["var_y"].to_numpy(), shape=shape, var_f=var_f)
    return pd.Series(out, index=test.index)


def width_violins(test: pd.DataFrame, units: str = "", colors: dict[str, str] | None = None) -> go.Figure:
    """Violins of the 95 % PI widths per model, split by stratum (urban / rural = metro / non-metro).

    Two strata share each model's violin as left / right halves; three to six strata get one violin each
    side by side. Every (model, stratum) violin is its own trace drawn to the same width, so neither a
    small stratum nor a model with near-constant widths squashes the others to a line; each spans its
    data's range.
    """
    df = test.assign(width=test_widths(test), stratum=test.get("stratum", "all"))
    df["stratum"] = df["stratum"].astype(str)
    strata = ordered_strata(df["stratum"].unique())
    if not strata:
        strata = ["all"]
        df = df.assign(stratum="all")
    colors = colors or stratum_colors(strata)
    fig = go.Figure()
    two = len(strata) == 2
    models = list(dict.fromkeys(df["model"]))
    for i, s in enumerate(strata):
        for j, model in enumerate(models):
            # one trace per (model, stratum): plotly scales the violins of one trace together, so a model
            # with near-constant widths (SVGP) would squash every other model's violin to a line
            part = df[(df["stratum"] == s) & (df["model"] == model)]
            if part.empty:
                continue
            fig.add_trace(
                go.Violin(
                    x=part["model"], y=part["width"], name=html_text(DISPLAY.get(s, s)), legendgroup=s,
                    showlegend=j == 0, offsetgroup=s, side=("negative" if i == 0 else "positive") if two else "both",
                    line_color=colors.get(s, PALETTE[i % len(PALETTE)]), meanline_visible=True, points=False,
                    spanmode="hard", scalemode="width", width=0.9 if two else 0,
                )
            )
    drawn = df.loc[df["stratum"].isin(strata), "width"]  # not 'unknown' (drawn by no violin)
    lo, hi = (float(np.nanmin(drawn)), float(np.nanmax(drawn))) if len(drawn) else (0.0, 1.0)
    pad = 0.08 * (hi - lo or 1.0)
    fig.update_layout(violinmode="overlay" if two else "group", violingap=0.25, violingroupgap=0.05,
                      yaxis=dict(title=f"95% PI width ({units})" if units else "95% PI width",
                                 range=[max(lo - pad, 0.0), hi + pad]), **LAYOUT)
    return fig


def coverage_bars(metrics: pd.DataFrame, target: float = 0.95, colors: dict[str, str] | None = None) -> go.Figure:
    """Coverage of the 95 % interval per model and stratum, with the target line in context (80-100 %), and with
    ``two_se`` (:func:`gpcore.run.compare.coverage_bands`) two-SE error bars."""
    fig = go.Figure()
    groups = ["all", *ordered_strata(metrics["group"].unique())] if "all" in set(metrics["group"]) else \
        ordered_strata(metrics["group"].unique())
    colors = {**(colors or stratum_colors(groups)), "all": STRATUM_COLORS["all"]}
    for g in groups:
        part = metrics[metrics["group"] == g]
        band = part["two_se"].to_numpy(float) if "two_se" in part else np.full(len(part), np.nan)
        error = dict(type="data", array=np.nan_to_num(band).tolist(), visible=bool(np.isfinite(band).any()),
                     color="rgba(0,0,0,0.55)", thickness=1.2, width=3)
        fig.add_trace(go.Bar(x=part["model"], y=part["coverage"], name=html_text(DISPLAY.get(str(g), str(g))),
                             marker_color=colors.get(str(g)), cliponaxis=False, error_y=error,
                             # inside, turned upright: side by side above narrow bars the labels overlapped
                             text=[f"{100 * v:.1f}%" for v in part["coverage"]], textposition="inside",
                             textangle=-90, insidetextanchor="end", insidetextfont=dict(color="white")))
    fig.add_hline(y=target, line_dash="dash", line_color="black")
    fig.add_annotation(x=1.0, xref="paper", xanchor="left", y=target, yref="y", text=f"{100 * target:.0f}% target",
                       showarrow=False, font=dict(size=11))
    shown = metrics["coverage"][metrics["group"].astype(str).isin(groups)]  # not the left-out "unknown" points
    lo = float(np.nanmin(shown)) if len(shown) else 0.8
    yaxis = dict(title="coverage of the 95% interval", tickformat=".0%", range=[min(lo - 0.03, 0.8), 1.04])
    # room for the target's label right of the plot; the legend below the models: with the measurement-count bins
    # it wraps to several rows, which above the plot covered the bars' tops
    layout = {**LAYOUT, "margin": dict(l=10, r=78, t=10, b=10), "height": 440,
              "legend": dict(orientation="h", yanchor="top", y=-0.12, x=0)}
    fig.update_layout(barmode="group", yaxis=yaxis, uniformtext=dict(minsize=8, mode="hide"), **layout)
    return fig


def calibration(test: pd.DataFrame) -> go.Figure:
    """Observed coverage against nominal level per model (the diagonal is perfect calibration)."""
    fig = go.Figure()
    fig.add_trace(go.Scatter(x=[0, 1], y=[0, 1], mode="lines", name="ideal", line=dict(color="gray", dash="dot")))
    levels = np.array([0.05, *M.CALIBRATION_LEVELS])
    for model, part in test.groupby("model", sort=False):
        shape = of_rows(part)
        cc = M.calibration_curve(part["mean"], part["var_y"], part["y"], levels=tuple(levels), shape=shape,
                                 var_f=part["var_f"] if shape is not None else None)
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
    """Rounded copy for display (coverage as a percentage; ``two_se`` as its band,
    :func:`gpcore.run.compare.band_text`)."""
    out = df.copy()
    for col in ("mae", "rmse", "nll", "crps", "pi_width_mean", "pi_width_median"):
        if col in out:
            out[col] = out[col].map(lambda v: f"{v:.4f}")
    if "two_se" in out:  # before "coverage" is formatted: the ✗ compares the numbers
        from gpcore.run.compare import band_text

        out["two_se"] = [band_text(c, s) for c, s in zip(out["coverage"], out["two_se"], strict=True)]
        out = out.rename(columns={"two_se": "± 2 SE"})
    if "coverage" in out:
        out["coverage"] = out["coverage"].map(lambda v: f"{100 * v:.1f}%")
    for col in ("fit_seconds", "predict_seconds"):
        if col in out:
            out[col] = out[col].map(lambda v: f"{v:.2f}")
    return out
