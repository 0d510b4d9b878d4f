"""Compare: the runs on the current data set, ranked; PI-width violins by stratum; coverage; calibration."""

from __future__ import annotations

import numpy as np
import pandas as pd
import streamlit as st

from app import cache, charts
from app.safe_html import md_text
from gpcore.errors import GPCoreError

METRIC_COLS = ["n", "mae", "rmse", "nll", "crps", "coverage", "pi_width_mean", "fit_seconds", "predict_seconds"]


def pick_runs(runs, data_hash: str) -> list:
    show_all = st.toggle("Include runs on other data sets", value=False, key="w_cmp_all")
    pool = runs if show_all else [r for r in runs if r.data_hash == data_hash]
    if not pool:
        st.info("No runs on the active data set yet: train one on the Train page, or include runs on other data.")
        return []
    titles = cache.run_titles(pool)
    ids = [r.run_id for r in pool]
    chosen = st.multiselect("Runs", ids, default=ids[:6], format_func=titles.get, key="w_cmp_runs")
    by_id = {r.run_id: r for r in pool}
    return [by_id[i] for i in chosen]


def names_for(infos) -> dict[str, str]:
    """Short unique chart names: the model, plus the run's time (or "bundled") when a model repeats."""
    base = [i.model for i in infos]
    out: dict[str, str] = {}
    for info, name in zip(infos, base, strict=True):
        if base.count(name) > 1:
            tag = "bundled" if info.bundled else (info.manifest.get("created") or "")[11:19] or info.run_id[-6:]
            name = f"{name} ({tag})"
        while name in out.values():
            name += "'"
        out[info.run_id] = name
    return out


def page() -> None:
    ss = st.session_state
    st.title("Compare")
    data: cache.LoadedData = ss.ua_data
    runs = ss.get("ua_runs") or cache.list_runs()
    infos = pick_runs(runs, data.data_hash)
    if not infos:
        return
    names = names_for(infos)
    keys = {i.run_id: cache.run_key(i) for i in infos}
    metrics = []
    for info in infos:
        try:
            m = cache.st_metrics(*keys[info.run_id]).copy()
        except GPCoreError as exc:  # one damaged run is named and left out, the others are compared
            st.warning(md_text(exc))
            continue
        if m.empty:
            continue
        m.insert(0, "model", names[info.run_id])
        m["run"] = cache.run_title(info.run_id, info.manifest)
        metrics.append(m)
    if not metrics:
        st.warning("The chosen runs have no metrics.")
        return
    table = pd.concat(metrics, ignore_index=True)
    try:
        units = cache.st_run_data(*keys[infos[0].run_id]).t_units or "target units"
    except GPCoreError:
        units = "target units"
    st.caption(f"Metrics on each run's test split, in the space the models train in ({units}); "
               "ranked by overall NLL (lower is better). Coverage target: 95%.")
    overall = table[table.group == "all"].sort_values("nll").reset_index(drop=True)
    overall.insert(0, "rank", np.arange(1, len(overall) + 1))
    st.subheader("Ranking")
    st.dataframe(charts.format_metrics(overall[["rank", "model", *[c for c in METRIC_COLS if c in overall], "run"]]),
                 hide_index=True, width="stretch")
    from gpcore.runs import NO_RECAL

    is_before = table.group.astype(str).str.endswith(NO_RECAL)
    before, table = table[is_before], table[~is_before]
    per = table[table.group != "all"]
    if not per.empty:
        st.subheader("Per stratum")
        order = {m: i for i, m in enumerate(overall["model"])}
        per = per.assign(_o=per["model"].map(order)).sort_values(["group", "_o"]).drop(columns="_o")
        st.dataframe(charts.format_metrics(per[["group", "model", *[c for c in METRIC_COLS if c in per]]]),
                     hide_index=True, width="stretch")
    if not before.empty:
        recal = sorted({names[i.run_id] for i in infos if i.manifest.get("recalibration")})
        st.subheader("Without recalibration")
        st.caption(f"{', '.join(recal)}: variances rescaled per stratum on the validation split (the tables above); "
                   "here the same test rows before that.")
        st.dataframe(charts.format_metrics(before[["group", "model", *[c for c in METRIC_COLS if c in before]]]),
                     hide_index=True, width="stretch")

    tests = []
    for info in infos:
        try:
            t = cache.st_test_predictions(*keys[info.run_id])
        except GPCoreError as exc:
            st.warning(md_text(exc))
            continue
        if t.empty:
            continue
        t = t.assign(model=names[info.run_id])
        tests.append(t)
    if tests:
        test = pd.concat(tests, ignore_index=True)
        colors = charts.stratum_colors([*test.get("stratum", pd.Series(dtype=str)).astype(str).unique(),
                                        *table["group"].astype(str).unique()])
        cfg = charts.CONFIG
        c1, c2 = st.columns(2)
        with c1:
            st.subheader("95% PI widths by stratum")
            st.plotly_chart(charts.width_violins(test, units, colors), width="stretch", key="cmp_violins", config=cfg)
        with c2:
            st.subheader("Coverage per stratum")
            st.plotly_chart(charts.coverage_bars(table, colors=colors), width="stretch", key="cmp_coverage",
                            config=cfg)
        c3, c4 = st.columns(2)
        with c3:
            st.subheader("Calibration")
            st.plotly_chart(charts.calibration(test), width="stretch", key="cmp_calibration", config=cfg)
        with c4:
            st.subheader("Fit and predict times")
            st.plotly_chart(charts.timings(overall), width="stretch", key="cmp_timings", config=cfg)


page()
