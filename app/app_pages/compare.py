"""Compare: the runs on the current data set, ranked; PI-width violins by stratum; coverage; calibration.

Runs are compared within one test-split kind: a random 8:1:1 split (test rows between training rows) or
spatial blocks (whole squares held out: test rows inside gaps). When the data set has runs of both kinds a
"Test split" control picks the kind and a table sets each model's random and block results side by side;
when it has one kind the page says so and shows the command that makes the other. Runs with time as an input
tested on later quarters (``--split forecast --test-period``) are a third kind, "Forecast (<test period>)".
Every coverage comes with two standard errors, by held-out block on a block split and binomial otherwise
(:func:`gpcore.run.compare.coverage_bands`; docs/metrics.md, "Coverage and its band"). Runs scored on other test
rows (another split seed or data set) are ranked apart (:func:`test_rows`; docs/app.md, Compare), and models on
several split seeds are compared paired on the seeds they share (:func:`seeds_section`; docs/metrics.md, "Several
split seeds").
"""

from __future__ import annotations

import shlex

import numpy as np
import pandas as pd
import streamlit as st

from app import bands, cache, charts, state
from app.safe_html import md_text
from gpcore.errors import GPCoreError

METRIC_COLS = ["n", "mae", "rmse", "nll", "crps", "coverage", "two_se", "pi_width_mean", "fit_seconds",
               "predict_seconds"]
#: Runs compared on first open (newest first, then the bundled ones: all ten of a fresh install's two kinds fit).
DEFAULT_RUNS = 8
#: The tables' split column wide enough to read "Spatial blocks (10 km)" whole, and the test rows' names.
COLUMN_WIDTHS = {"split": st.column_config.TextColumn("split", width="medium"),
                 "test rows": st.column_config.TextColumn("test rows", width="large")}


def pick_runs(runs, data) -> tuple[list, str]:
    """The chosen runs, all of one test-split kind, and that kind (:func:`app.bands.split_key`)."""
    show_all = st.toggle("Include runs on other data sets", value=False, key="w_cmp_all")
    pool = runs if show_all else [r for r in runs if r.data_hash == data.data_hash]
    if not pool:
        periods = [r for r in runs if data.period_free_hash and r.period_free_hash == data.period_free_hash]
        if periods:  # e.g. a time run trained on some of the data set's quarters (Train page: First / Last quarter)
            st.info(f"No runs on the active data set yet, but {len(periods)} on other periods of it (marked [other "
                    "period] in the sidebar, such as a model over some of its quarters): turn on 'Include runs on "
                    "other data sets' to compare them.")
        else:
            st.info("No runs on the active data set yet: train one on the Train page, or include runs on other "
                    "data.")
        return [], "random"
    kind = pick_split(pool)
    pool = [r for r in pool if bands.split_key(r) == kind]
    titles = cache.run_titles(pool)
    ids = [r.run_id for r in pool]
    # one choice of runs per split kind, and another with other data sets (turning them on shows them)
    key = ("w_cmp_runs" if kind == "random" else f"w_cmp_runs_{kind}") + ("_all" if show_all else "")
    chosen = st.multiselect("Runs", ids, default=ids[:DEFAULT_RUNS], format_func=titles.get, key=key)
    by_id = {r.run_id: r for r in pool}
    return [by_id[i] for i in chosen], kind


def split_order(kind: str) -> tuple:
    """Random first, then spatial blocks by size, then forecasts by test period."""
    if kind == "random":
        return (0, 0.0, "")
    if kind.startswith("forecast:"):
        return (2, 0.0, kind)
    return (1, float(kind.split(":", 1)[1]), "")


def split_name(kind: str) -> str:
    """``"Random"``, ``"Spatial blocks (10 km)"`` or ``"Forecast (2023Q1:2023Q4)"``: the control's option and the
    tables' ``split`` column."""
    if kind.startswith("forecast:"):
        return f"Forecast ({kind.split(':', 1)[1]})"
    return "Random" if kind == "random" else f"Spatial blocks ({kind.split(':', 1)[1]} km)"


def split_caption(kind: str) -> str:
    if kind.startswith("forecast:"):
        period = kind.split(":", 1)[1]
        return (f"Test split: **forecast** — trained on the quarters before {period} and tested on {period} (time is "
                "an input of these runs), so this measures the intervals *ahead in time*.")
    if kind == "random":
        return ("Test split: **random** 8:1:1 — test rows lie between training rows, so this measures the intervals "
                "*between* measurements.")
    km = kind.split(":", 1)[1]
    return (f"Test split: **spatial blocks of {km} km** — whole {km} km squares held out (8:1:1 by points), so "
            "test rows lie inside gaps with no training data: the intervals *where nothing was measured*.")


def pick_split(pool) -> str:
    """The "Test split" control when ``pool`` has runs of several split kinds (else a note on making the other)."""
    kinds = sorted({bands.split_key(r) for r in pool}, key=split_order)
    if len(kinds) > 1:
        if state.view().cmp_split not in kinds:
            state.update(cmp_split=kinds[0])
        return state.control(st.segmented_control, "Test split", kinds, format_func=split_name, name="cmp_split",
                             valid=kinds.__contains__,
                             help="Random: test rows between training rows. Spatial blocks: whole squares held out, "
                                  "so test rows lie inside gaps. Forecast: later quarters held out. A model "
                                  "calibrated only between measurements is not calibrated.")
    kind = kinds[0]
    other = "block" if kind == "random" else "random"  # a forecast's neighbour: the same runs on a random split
    newest = pool[0]
    cfg = {**newest.manifest.get("config", {}), "split": other, "block_km": 10.0}
    from gpcore.run.config import fit_command
    from gpcore.run.store import RunStore

    out = shlex.quote(str(RunStore().root / f"{newest.model}-{other}"))
    what = ("spatial blocks (test rows inside gaps)" if other == "block" else "a random split")
    st.info(f"Every run here was tested on one kind of split: **{split_name(kind)}**. To see the models on {what}, "
            "train with the other split on the Train page (Split), or run:")
    st.code(fit_command(cfg, out=out), language="bash")
    return kind


def split_summary_table(runs) -> pd.DataFrame:
    """Each model's newest run per split kind, random vs blocks (:func:`gpcore.run.compare.split_summary`), from the
    runs' manifests; empty when no model has runs of both kinds."""
    from gpcore.run.compare import split_summary

    rows = []
    for r in runs:
        cfg = r.manifest.get("config", {})
        overall = next((m for m in r.manifest.get("metrics", []) if m.get("group") == "all"), None)
        if cfg.get("split") == "forecast":  # not a random-vs-blocks pair
            continue
        if overall is None or overall.get("nll") is None or overall.get("coverage") is None:
            continue
        block = cfg.get("split") == "block"
        rows.append({"model": r.model, "split": "block" if block else "random",
                     "block_km": float(cfg.get("block_km", 10.0)) if block else np.nan, "group": "all",
                     "nll": overall["nll"], "coverage": overall["coverage"]})
    if not rows:
        return pd.DataFrame()
    s = split_summary(pd.DataFrame(rows))
    if s.empty:
        return s
    return pd.DataFrame({
        "model": s["model"],
        "split": [split_name(f"block:{km:g}") for km in s["block_km"]],
        "NLL random": s["nll_random"].map("{:.4f}".format),
        "NLL blocks": s["nll_block"].map("{:.4f}".format),
        "NLL change": s["nll_change"].map("{:+.4f}".format),
        "coverage random": s["coverage_random"].map(lambda v: f"{100 * v:.1f}%"),
        "coverage blocks": s["coverage_block"].map(lambda v: f"{100 * v:.1f}%"),
        "coverage change": s["coverage_change"].map(lambda v: f"{100 * v:+.1f} pp"),
    })


def data_parts(config: dict, seed: int) -> dict[str, str]:
    """What fixes a run's test rows and their scale, in words: the data (a bundled sample's label, else the file's
    name), the period, the target with its transform, strata, weights and the split's seed."""
    return {"data": state.data_name(str(config.get("data") or "?")),
            "period": str(config.get("quarter") or "all quarters"),
            "target": f"{config.get('y', '?')} ({config.get('transform') or 'identity'})",
            "strata": f"strata {config.get('strata') or 'none'}",
            "weights": f"weights {config.get('weight') or 'none'}",
            "seed": f"seed {seed}"}


def test_rows(infos, data) -> dict[str, tuple[int, str, str]]:
    """``{run_id: (order, title, data title)}``: which test rows each run was scored on. Within one split kind
    two runs share their test rows when they share the data set (:attr:`~gpcore.run.store.RunInfo.data_hash`) and
    the split's seed; NLL, CRPS and coverage compare only between such runs, so the ranking ranks within each.
    ``title`` names what differs between the sets (:func:`data_parts`: ``"2023 · seed 1"``), ``""`` when every run
    shares one; the data title is the same without the seed; ``order`` puts the active data set first."""
    key = {i.run_id: (i.data_hash, i.seed) for i in infos}
    if len(set(key.values())) < 2:
        return {rid: (0, "", "") for rid in key}
    parts = {key[i.run_id]: data_parts(i.manifest.get("config", {}), key[i.run_id][1]) for i in infos}
    differ = [name for name in next(iter(parts.values())) if len({p[name] for p in parts.values()}) > 1]
    names = {k: " · ".join(p[name] for name in differ if name != "seed") for k, p in parts.items()}
    if len({*names.values()}) < len({h for h, _ in parts}):  # alike in every part named: the identities tell
        names = {k: " · ".join(filter(None, [t, f"data {k[0][:8]}"])) for k, t in names.items()}
    titles = {k: " · ".join(filter(None, [names[k], parts[k]["seed"] if "seed" in differ else ""])) for k in parts}
    ordered = sorted(titles, key=lambda k: (k[0] != data.data_hash, names[k], k[1]))
    return {rid: (ordered.index(k), titles[k], names[k]) for rid, k in key.items()}


def model_labels(infos) -> dict[str, str]:
    """``{run_id: label}`` naming a model with its settings, the same for its runs on every seed: the model's name,
    plus the settings that set it apart from another run of that model (``"dbk-nn (neighbors=50)"``)."""
    import json

    settings = {i.run_id: i.manifest.get("config", {}).get("settings") or {} for i in infos}
    by_model: dict[str, set] = {}
    for i in infos:
        by_model.setdefault(i.model, set()).add(json.dumps(settings[i.run_id], sort_keys=True, default=str))
    out = {}
    for i in infos:
        kinds = [json.loads(k) for k in by_model[i.model]]
        own = settings[i.run_id]
        differ = sorted({k for other in kinds for k in {*other, *own} if other.get(k) != own.get(k)})
        bits = ", ".join(f"{k}={own.get(k, 'default')}" for k in differ)
        out[i.run_id] = f"{i.model} ({bits})" if bits else i.model
    return out


def seeds_section(infos, overall: pd.DataFrame, rows_of: dict) -> None:
    """"Across split seeds": each model paired over the split seeds the chosen runs share on one data set
    (:func:`gpcore.run.compare.seed_summary`), when they span two seeds or more; else, for two models or more, a note
    on how to get it. ``rows_of``: :func:`test_rows`."""
    from gpcore.run.compare import seed_summary

    labels = model_labels(infos)
    info_of = {i.run_id: i for i in infos}
    runs = overall.assign(model=overall["run_id"].map(labels), seed=overall["run_id"].map(lambda r: info_of[r].seed),
                          data=overall["run_id"].map(lambda r: info_of[r].data_hash))
    shown = False
    for _, part in runs.groupby("data", sort=False):
        part = part.drop_duplicates(["model", "seed"])  # newest first: one run per model and seed
        if part["seed"].nunique() < 2:
            continue
        summary, left_out = seed_summary(part)
        if len(summary) < 2:  # one model over its seeds is no comparison
            continue
        shown = True
        st.subheader("Across split seeds")
        title = rows_of[part["run_id"].iloc[0]][2]
        st.caption(f"{title + ': e' if title else 'E'}ach model over the {int(summary['seeds'].iloc[0])} split seeds "
                   "all of them were tested on: one split's ranking is one draw, and another seed holds out other "
                   "rows. Mean NLL and CRPS over the seeds, the coverage of all their test rows (± 2 binomial SEs, "
                   "rows taken as independent), the paired NLL difference to the best model (± 2 SEs of the mean "
                   "difference) and on how many seeds each was best."
                   + (f" Left out (too few seeds in common): {', '.join(left_out)}." if left_out else ""))
        table = summary.rename(columns={"nll": "mean nll", "crps": "mean crps", "best_on": "best on (seeds)"})
        table["mean nll"] = table["mean nll"].map("{:.4f}".format)
        table["mean crps"] = table["mean crps"].map("{:.4f}".format)
        table["ΔNLL vs best"] = ["best" if i == 0 else f"{d:+.4f} ± {e:.4f}" for i, (d, e) in
                                 enumerate(zip(summary["nll_vs_best"], summary["nll_vs_best_2se"], strict=True))]
        table["coverage"] = [f"{100 * c:.1f}% ± {100 * e:.1f}" for c, e in zip(summary["coverage"], summary["two_se"],
                                                                             strict=True)]
        st.dataframe(table[["model", "seeds", "mean nll", "ΔNLL vs best", "mean crps", "coverage",
                            "best on (seeds)"]], hide_index=True, width="stretch")
    if not shown and runs["model"].nunique() > 1:
        st.caption("One split seed per model: another seed holds out other rows and can reorder close models. Train "
                   "them on other seeds too (Train page: Seed), or run `python -m gpcore compare ... --seeds 0,1,2`, "
                   "and an 'Across split seeds' table compares them paired over the seeds.")


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


def render(data: cache.LoadedData, runs: list) -> None:
    """The Compare page: the chosen runs on ``data`` (or on any data set), ranked, with their charts."""
    st.title("Compare")
    infos, kind = pick_runs(runs, data)
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
        m.insert(1, "split", split_name(bands.split_key(info)))
        m["run"] = cache.run_title(info.run_id, info.manifest)
        m["run_id"] = info.run_id
        metrics.append(bands.with_band(m, keys[info.run_id], info.manifest.get("config", {})))
    if not metrics:
        st.warning("The chosen runs have no metrics.")
        return
    table = pd.concat(metrics, ignore_index=True)
    try:
        units = cache.st_run_data(*keys[infos[0].run_id]).t_units or "target units"
    except GPCoreError:
        units = "target units"
    rows_of = test_rows(infos, data)
    grouped = any(title for _, title, _ in rows_of.values())
    st.caption(f"Metrics on each run's test split, in the space the models train in ({units}); "
               "ranked by overall NLL (lower is better). Coverage target: 95%.")
    group_col = ["test rows"] if grouped else []  # NLLs on different test rows do not compare: one ranking each
    table = table.assign(**{"test rows": table["run_id"].map(lambda rid: rows_of[rid][1]),
                            "_g": table["run_id"].map(lambda rid: rows_of[rid][0])})
    overall = table[table.group == "all"].sort_values(["_g", "nll"]).reset_index(drop=True)
    overall.insert(0, "rank", overall.groupby("_g").cumcount() + 1)
    st.subheader("Ranking")
    st.markdown(split_caption(kind))
    st.caption(bands.band_caption(kind))
    if grouped:
        st.warning(f"These runs were scored on {overall['_g'].nunique()} different sets of test rows (other data "
                   "sets or split seeds), and a metric only compares on the same rows: the ranking restarts for "
                   "each set ('test rows').")
    st.dataframe(charts.format_metrics(overall[["rank", *group_col, "model", "split",
                                                *[c for c in METRIC_COLS if c in overall], "run"]]),
                 hide_index=True, width="stretch", column_config=COLUMN_WIDTHS)
    seeds_section(infos, overall, rows_of)
    from gpcore.run.pipeline import NO_RECAL

    is_before = table.group.astype(str).str.endswith(NO_RECAL)
    before, table = table[is_before], table[~is_before]
    per = table[table.group != "all"]
    if not per.empty:
        st.subheader("Per stratum")
        order = {m: i for i, m in enumerate(overall["model"])}
        per = per.assign(_o=per["model"].map(order)).sort_values(["group", "_g", "_o"]).drop(columns="_o")
        st.dataframe(charts.format_metrics(per[["group", *group_col, "model", "split",
                                                *[c for c in METRIC_COLS if c in per]]]),
                     hide_index=True, width="stretch", column_config=COLUMN_WIDTHS)
    if not before.empty:
        recal = sorted({names[i.run_id] for i in infos if i.manifest.get("recalibration")})
        from gpcore.models.vecchia_cv import applied, recorded_count_scales, recorded_shape  # one reader each

        cv = sorted({names[i.run_id] for i in infos if applied(i.manifest.get("train_info")) is not None})
        skewed = sorted({names[i.run_id] for i in infos if recorded_shape(i.manifest.get("train_info")) is not None})
        counts = sorted({names[i.run_id] for i in infos
                         if recorded_count_scales(i.manifest.get("train_info")) is not None})
        how = [f"{', '.join(recal)}: variances rescaled on the validation split"] if recal else []
        how += [f"{', '.join(cv)}: latent variance scaled by cross-validation over the labelled rows"] if cv else []
        how += [f"{', '.join(skewed)}: with the skewed noise fitted there (here Gaussian)"] if skewed else []
        how += [f"{', '.join(counts)}: and its noise scaled per tests count (here not)"] if counts else []
        st.subheader("Without recalibration")
        st.caption(f"{'; '.join(how)} (the tables above); here the same test rows before that.")
        st.dataframe(charts.format_metrics(before[["group", *group_col, "model", "split",
                                                   *[c for c in METRIC_COLS if c in before and c != "two_se"]]]),
                     hide_index=True, width="stretch", column_config=COLUMN_WIDTHS)
    on_data = [r for r in runs if r.data_hash == data.data_hash]
    summary = split_summary_table(on_data)
    if not summary.empty:
        st.subheader("Random vs spatial blocks")
        st.caption("Each model's newest run on this data set per test split: overall test NLL and 95% coverage, and "
                   "the change (blocks − random). Coverage that drops on blocks means intervals calibrated only "
                   "between measurements.")
        st.dataframe(summary, hide_index=True, width="stretch", column_config=COLUMN_WIDTHS)

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

