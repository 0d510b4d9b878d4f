"""Fit several models on seeded splits and rank them (``python -m gpcore compare``).

Every model sees the same data, transform, strata and splits. A *split* is ``"random"`` (a seeded
8:1:1 split of the rows: test rows lie between training rows) or ``"block"`` (whole ``block_km``
squares go to train, validation or test: test rows lie inside gaps with no training data) or ``"forecast"``
(test on the quarters of ``test_period``, train on the earlier ones: docs/methods/spacetime.md). A model
whose intervals cover 95 % only on random test rows is calibrated only between measurements, so
``python -m gpcore compare`` evaluates both by default.

Each run is written under ``OUT/runs/<split>/<model>`` and the combined table to
``OUT/metrics.{csv,md,json}`` with a ``split`` (and ``block_km``) column, ranked by the overall test
NLL within each split, each coverage with two SEs (``coverage_2se``, :func:`coverage_bands`);
``OUT/split_summary.csv`` holds each model's random-vs-block change in NLL and 95 % coverage. Metrics are in the
transformed units the models train in (e.g. log10 Mbps). With several split seeds (``--seeds``, :func:`compare_seeds`)
each seed's comparison goes to ``OUT/seed<k>/`` and ``OUT/seed_summary.{csv,md}`` pairs the models over the seeds
(:func:`seed_summary`).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pandas as pd

from gpcore.errors import ConfigError, DataError
from gpcore.metrics import coverage_se
from gpcore.run import rundir
from gpcore.run.config import RunConfig
from gpcore.run.pipeline import execute_run, prepare, split_indices

SPLITS = ("random", "block", "forecast")

COLUMNS = [
    "model",
    "split",
    "block_km",
    "group",
    "n",
    "mae",
    "rmse",
    "nll",
    "crps",
    "coverage",
    "coverage_2se",
    "pi_width_mean",
    "pi_width_median",
    "fit_seconds",
    "predict_seconds",
]

SUMMARY_COLUMNS = ["model", "split", "block_km", "nll_random", "nll_block", "nll_change", "coverage_random",
                   "coverage_block", "coverage_change"]


def split_label(split: str, block_km=None) -> str:
    """How a split is named in tables and captions: ``"random"``, ``"forecast"`` or ``"block 10 km"``."""
    if split != "block":
        return "forecast" if split == "forecast" else "random"
    try:
        km = float(block_km)
    except (TypeError, ValueError):
        return "block"
    return f"block {km:g} km" if np.isfinite(km) else "block"


def parse_splits(splits) -> list[str]:
    """``"random,block"`` or a list of split kinds -> a checked list (ConfigError naming the allowed values)."""
    items = [s.strip() for s in splits.split(",")] if isinstance(splits, str) else [str(s).strip() for s in splits]
    items = [s for s in items if s]
    bad = [s for s in items if s not in SPLITS]
    if bad or not items or len(set(items)) != len(items):
        raise ConfigError(
            f"splits={','.join(items) or '(none)'!r} is not allowed; give one or both of 'random' and 'block', "
            "and/or 'forecast' (with --test-period), each once (e.g. --splits random,block)"
        )
    return items


def split_settings(sets: dict) -> tuple[dict, dict[str, dict]]:
    """``(common settings, {model: its own settings})`` from ``{"lr": .., "svgp.num_inducing": ..}``."""
    common = {k: v for k, v in sets.items() if "." not in k}
    overrides: dict[str, dict] = {}
    for k, v in sets.items():
        if "." in k:
            name, key = k.split(".", 1)
            overrides.setdefault(name, {})[key] = v
    return common, overrides


def compare_models(base: RunConfig, models: list[str], out_dir, overrides: dict[str, dict] | None = None,
                   log=print, callback_factory=None, splits=None) -> pd.DataFrame:
    """Run each model in ``models`` with ``base``'s data settings on each split; return the ranked tidy table.

    ``splits`` lists the split kinds (``["random", "block"]``); None means ``[base.split]`` alone (one split,
    as before). The block size is ``base.block_km``. ``overrides`` maps a model name to extra settings for it
    (``--set dbk-rbf.rank=256``). The data are read once; every split is drawn from the same rows and seed.
    """
    splits = parse_splits([base.split] if splits is None else splits)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    first = prepare(dataclasses.replace(base, split="random"))  # read once; every split drawn before any fit
    log(first.report_text or f"{len(first.y)} rows")
    preps = {s: first if s == "random" else _resplit(first, dataclasses.replace(base, split=s)) for s in splits}
    tables = []
    for split in splits:
        split_cfg = dataclasses.replace(base, split=split)
        prep = preps[split]
        label = split_label(split, base.block_km)
        log(f"=== split: {label} (train/val/test = {len(prep.train_idx)}/{len(prep.val_idx)}/{len(prep.test_idx)})")
        for name in models:
            settings = {**base.settings, **(overrides or {}).get(name, {})}
            cfg = dataclasses.replace(split_cfg, model=name, settings=settings, label=f"{name} ({label} split)")
            log(f"--- fitting {name} on the {label} split ({len(prep.train_idx)} training points)")
            cb = callback_factory(name) if callback_factory else None
            run_dir = execute_run(cfg, out / "runs" / split / name, callback=cb, prepared=prep, log=log)
            t = rundir.read_metrics(run_dir)
            bands = coverage_bands(rundir.read_test_predictions(run_dir), cfg.to_dict())
            band = bands[["group", "two_se"]].rename(columns={"two_se": "coverage_2se"})
            t = t.merge(band, on="group", how="left")  # groups before recalibration: no band
            t.insert(0, "model", name)
            t.insert(1, "split", split)
            t.insert(2, "block_km", float(base.block_km) if split == "block" else np.nan)
            tables.append(t)
            log(t[["group", "n", "mae", "nll", "coverage", "pi_width_mean", "fit_seconds"]].to_string(index=False))
    table = rank_within_splits(pd.concat(tables, ignore_index=True)[COLUMNS], splits)
    write_tables(table, out, base, splits)
    return table


def _resplit(prep, cfg: RunConfig):
    """``prep`` with the train / validation / test rows of ``cfg``'s split (same data, same seed)."""
    try:
        tr, va, te = split_indices(cfg, prep.X, prep.t)
    except DataError as e:
        if cfg.split != "block":
            raise
        raise DataError(f"{e} (python -m gpcore compare: pass a smaller --block-km, or --splits random)") from None
    return dataclasses.replace(prep, train_idx=np.asarray(tr), val_idx=np.asarray(va), test_idx=np.asarray(te))


def rank_within_splits(table: pd.DataFrame, splits=None) -> pd.DataFrame:
    """Add ``rank`` (1 = lowest overall test NLL) within each split; order rows by split, rank, then "all" first."""
    splits = list(splits) if splits is not None else list(dict.fromkeys(table["split"]))
    ranks = {}
    for split in splits:
        overall = table[(table.split == split) & (table.group == "all")].sort_values("nll", kind="stable")
        ranks.update({(split, m): i + 1 for i, m in enumerate(overall["model"])})
    table = table.copy()
    table["rank"] = [ranks.get((s, m)) for s, m in zip(table["split"], table["model"], strict=True)]
    key = pd.DataFrame({
        "s": table["split"].map({s: i for i, s in enumerate(splits)}),
        "r": table["rank"],
        "g": table["group"].ne("all"),
    })
    order = key.sort_values(["s", "r", "g"], kind="stable").index
    return table.loc[order].reset_index(drop=True)


def coverage_bands(test: pd.DataFrame, config: dict) -> pd.DataFrame:
    """Each group's 95 % coverage with the band that fits the run's split (docs/metrics.md, "Coverage and its band").

    ``test`` is a run's test predictions (``lon``, ``lat``, ``y``, ``mean``, ``var_y``; ``stratum`` and ``weight``
    when the run has them; ``var_f`` and the noise shape's columns for a skewed predictive) and ``config`` its
    manifest's config. One row per group the run's metrics have ("all", each stratum, each measurement-count bin
    named by ``config["weight"]``): ``group``, ``n``, ``coverage``, ``two_se`` and ``band``: on a block split two
    SEs by held-out block (the test rows' ``block_km`` squares, :func:`gpcore.data.splits.block_ids`: rows of one
    block share their errors), else
    binomial.
    """
    from gpcore import metrics as M
    from gpcore.data.splits import block_ids
    from gpcore.models.noise_shape import of_rows

    cols = ["group", "n", "coverage", "two_se", "band"]
    if test.empty:
        return pd.DataFrame(columns=cols)
    mean, var_y, y = (test[c].to_numpy(dtype=float) for c in ("mean", "var_y", "y"))
    shape = of_rows(test)  # a skewed predictive's intervals (None: Gaussian)
    var_f = test["var_f"].to_numpy(dtype=float) if shape is not None else None
    blocks = None
    if config.get("split") == "block":
        km = float(config.get("block_km", 10.0))
        blocks = block_ids(test["lon"].to_numpy(float), test["lat"].to_numpy(float), km)
    labels = [("all", np.ones(len(test), dtype=bool))]
    if "stratum" in test:
        strata = test["stratum"].astype(str).to_numpy()
        if not (strata == "all").all():
            labels += [(s, strata == s) for s in sorted(set(strata))]
    if "weight" in test:
        bins = M.weight_bins(test["weight"].to_numpy(float), config.get("weight") or "weight")
        labels += [(b, bins == b) for b in dict.fromkeys(bins)]
    rows = []
    for label, sel in labels:
        b = M.coverage_band(mean[sel], var_y[sel], y[sel], None if blocks is None else blocks[sel], shape=shape,
                            var_f=None if var_f is None else var_f[sel])
        rows.append({"group": label, "n": int(sel.sum()), "coverage": b["coverage"],
                     "two_se": b["two_se"] if blocks is None else b["two_se_groups"],
                     "band": "binomial" if blocks is None else "block"})
    return pd.DataFrame(rows, columns=cols)


def band_text(coverage: float, two_se: float) -> str:
    """``"± 1.3"`` (two SEs of a coverage, percentage points), with ``✗`` when the coverage is further than that from
    95 %; empty without a band (NaN). The one wording of :func:`coverage_bands`'s verdict: ``metrics.md`` and the
    Compare page."""
    if not np.isfinite(two_se):
        return ""
    return f"± {100 * two_se:.1f}" + (" ✗" if abs(coverage - 0.95) > two_se else "")


def split_summary(table: pd.DataFrame) -> pd.DataFrame:
    """Random vs spatial blocks per model: overall test NLL and 95 % coverage on each, and the change (block − random).

    ``table`` has the columns ``model``, ``split``, ``block_km``, ``group``, ``nll`` and ``coverage`` (the
    compare table, or one built from run manifests). One row per model and block size that has both a random
    and a block result; ``split`` names the block size (``"block 10 km"``). Empty when there is nothing to pair.
    """
    overall = table[table["group"] == "all"]
    random = overall[overall["split"] == "random"].drop_duplicates("model").set_index("model")
    rows = []
    block = overall[overall["split"] == "block"]
    for (model, km), part in block.groupby(["model", block["block_km"].fillna(-1.0)], sort=False):
        if model not in random.index:
            continue
        r, b = random.loc[model], part.iloc[0]
        rows.append({
            "model": model,
            "split": split_label("block", km if km >= 0 else None),
            "block_km": km if km >= 0 else np.nan,
            "nll_random": float(r["nll"]),
            "nll_block": float(b["nll"]),
            "nll_change": float(b["nll"]) - float(r["nll"]),
            "coverage_random": float(r["coverage"]),
            "coverage_block": float(b["coverage"]),
            "coverage_change": float(b["coverage"]) - float(r["coverage"]),
        })
    return pd.DataFrame(rows, columns=SUMMARY_COLUMNS)


SEED_COLUMNS = ["model", "seeds", "nll", "crps", "coverage", "two_se", "nll_vs_best", "nll_vs_best_2se", "best_on"]


def seed_summary(table: pd.DataFrame) -> tuple[pd.DataFrame, list[str]]:
    """Each model over several split seeds of one data set and split kind, paired on the seeds they share.

    One split's ranking is one draw: another seed holds out other rows and can reorder close models (docs/metrics.md,
    "Several split seeds"). ``table`` has one overall row per (``model``, ``seed``): ``nll``, ``crps``, ``coverage``
    and ``n`` (test rows). Models are compared on the seeds all of them have; while fewer than two are shared, the
    model with the fewest seeds is left out (returned second, by name). Per model: ``seeds``, the mean ``nll`` and
    ``crps`` over them, the ``coverage`` of all their test rows with two binomial SEs (``two_se``, as if the seeds'
    rows were independent), the paired NLL difference to the model with the lowest mean (``nll_vs_best``) with two SEs
    of that mean difference (``nll_vs_best_2se``: 2 sd / sqrt(seeds)), and on how many seeds it had the lowest NLL
    (``best_on``). Sorted by mean NLL; empty when no two seeds are shared.
    """
    table = table.drop_duplicates(["model", "seed"])  # one run per model and seed: the first
    wide = table.pivot_table(index="seed", columns="model", values="nll", aggfunc="first")
    left_out: list[str] = []
    while wide.shape[1] and wide.dropna().shape[0] < 2:
        worst = wide.notna().sum().sort_values(kind="stable").index[0]
        left_out.append(str(worst))
        wide = wide.drop(columns=worst)
    wide = wide.dropna()
    if wide.shape[0] < 2 or not wide.shape[1]:
        return pd.DataFrame(columns=SEED_COLUMNS), sorted(set(table["model"].astype(str)))
    seeds = list(wide.index)
    part = table[table["seed"].isin(seeds) & table["model"].isin(wide.columns)]
    best = wide.mean().idxmin()
    winners = wide.idxmin(axis=1)
    rows = []
    for model, g in part.groupby("model", sort=False):
        n = g["n"].astype(float)
        cov = float(np.sum(n * g["coverage"]) / n.sum())
        d = wide[model] - wide[best]
        rows.append({"model": model, "seeds": len(seeds), "nll": float(wide[model].mean()),
                     "crps": float(g["crps"].mean()), "coverage": cov,
                     "two_se": 2 * coverage_se(int(n.sum())), "nll_vs_best": float(d.mean()),
                     "nll_vs_best_2se": 2 * float(d.std(ddof=1) / np.sqrt(len(d))),
                     "best_on": int((winners == model).sum())})
    return pd.DataFrame(rows, columns=SEED_COLUMNS).sort_values("nll", kind="stable").reset_index(drop=True), left_out


def compare_seeds(base: RunConfig, models: list[str], out_dir, seeds, **kw) -> pd.DataFrame:
    """:func:`compare_models` on each split seed in ``seeds`` (``OUT/seed<k>/``, each with its runs and tables; the
    seed is the split's and the models', as in a run), then each split kind's models paired over the seeds
    (:func:`seed_summary`), written to ``OUT/seed_summary.{csv,md}`` and returned (a ``split`` column first; models
    left out for too few seeds are named in the markdown). ``kw`` goes to :func:`compare_models`."""
    seeds = [int(s) for s in seeds]
    if len(set(seeds)) < 2:
        raise ConfigError(f"seeds={seeds}: give two different split seeds or more (e.g. --seeds 0,1,2)")
    out = Path(out_dir)
    tables = [compare_models(dataclasses.replace(base, seed=s), models, out / f"seed{s}", **kw).assign(seed=s)
              for s in dict.fromkeys(seeds)]
    overall = pd.concat(tables, ignore_index=True)
    overall = overall[overall["group"] == "all"]
    parts, notes = [], []
    for split, part in overall.groupby("split", sort=False):
        summary, left_out = seed_summary(part[["model", "seed", "nll", "crps", "coverage", "n"]])
        parts.append(summary.assign(split=split_label(split, base.block_km)))
        if left_out:
            notes.append(f"{split_label(split, base.block_km)}: left out (too few seeds in common) "
                         f"{', '.join(left_out)}")
    result = pd.concat(parts, ignore_index=True)[["split", *SEED_COLUMNS]]
    result.to_csv(out / "seed_summary.csv", index=False)
    fmt = result.copy()
    for col in ("nll", "crps", "nll_vs_best", "nll_vs_best_2se"):
        fmt[col] = fmt[col].map(lambda v: f"{v:.4f}")
    fmt["coverage"] = [f"{100 * c:.1f}% ± {100 * e:.1f}" for c, e in zip(result["coverage"], result["two_se"],
                                                                       strict=True)]
    fmt = fmt.drop(columns="two_se")
    (out / "seed_summary.md").write_text(
        f"# Across split seeds {', '.join(map(str, dict.fromkeys(seeds)))}\n\nEach model paired over the seeds "
        "every model of its split kind was run on (docs/metrics.md, \"Several split seeds\"): mean test NLL and "
        "CRPS, the paired NLL difference to the best model with two SEs, the coverage of all the seeds' test rows "
        "± two binomial SEs, and on how many seeds each model was best. One table per seed in seed<k>/metrics.md.\n\n"
        + _markdown(fmt) + "\n" + "".join(f"\n{n}\n" for n in notes))
    return result


def write_tables(table: pd.DataFrame, out: Path, base: RunConfig, splits=None) -> None:
    splits = list(splits) if splits is not None else list(dict.fromkeys(table["split"]))
    summary = split_summary(table)
    table.to_csv(out / "metrics.csv", index=False)
    if len(splits) > 1:
        summary.to_csv(out / "split_summary.csv", index=False)
    (out / "metrics.json").write_text(json.dumps(
        {"config": base.to_dict(), "splits": splits,
         "metrics": table.replace({np.nan: None}).to_dict(orient="records"),
         "split_summary": summary.replace({np.nan: None}).to_dict(orient="records")},
        indent=2, allow_nan=False,
    ))
    fmt = table.copy()
    for col in ("mae", "rmse", "nll", "crps", "pi_width_mean", "pi_width_median"):
        fmt[col] = fmt[col].map(lambda v: f"{v:.4f}")
    fmt["coverage"] = [f"{100 * c:.1f}% {band_text(c, s)}".rstrip()
                       for c, s in zip(fmt["coverage"], fmt["coverage_2se"], strict=True)]
    fmt = fmt.drop(columns="coverage_2se")
    for col in ("fit_seconds", "predict_seconds"):
        fmt[col] = fmt[col].map(lambda v: f"{v:.2f}")
    names = {"random": "random 8:1:1", "block": f"spatial blocks of {base.block_km:g} km (8:1:1 by points)",
             "forecast": f"forecast (test {base.test_period}, train on the quarters before)"}
    header = (
        f"# Model comparison\n\nData: `{base.data}` (quarter {base.quarter or 'default'}), target `{base.y}` "
        f"({base.transform}), split{'s' if len(splits) > 1 else ''} {' and '.join(names[s] for s in splits)}, "
        f"seed {base.seed}, strata {base.strata or 'none'}. Metrics on the test split in transformed units; "
        "ranked by overall NLL within each split. Coverage ± two SEs (`coverage_2se`: by held-out block on a block "
        "split, binomial otherwise; ✗ further than that from 95 %).\n"
    )
    parts = [header]
    titles = {"random": "Random split: test rows between training rows",
              "block": f"Spatial blocks: whole {base.block_km:g} km squares held out (test rows inside gaps)",
              "forecast": f"Forecast: test on {base.test_period}, trained on the quarters before it"}
    for split in splits:
        part = fmt[fmt["split"] == split].drop(columns=["split", "block_km"])
        parts.append(f"## {titles[split]}\n\n{_markdown(part)}\n")
    if len(splits) > 1:
        parts.append("## Random vs spatial blocks\n\nOverall test NLL and 95 % coverage on each split; change = "
                     "block − random (a model calibrated only between measurements loses coverage on blocks).\n\n"
                     + _summary_markdown(summary) + "\n")
    (out / "metrics.md").write_text("\n".join(parts))


def _summary_markdown(summary: pd.DataFrame) -> str:
    if summary.empty:
        return "(no model has results on both splits)"
    lines = ["| model | split | NLL random | NLL block | change | coverage random | coverage block | change |",
             "|---|---|---|---|---|---|---|---|"]
    for _, r in summary.iterrows():
        lines.append(
            f"| {r['model']} | {r['split']} | {r['nll_random']:.4f} | {r['nll_block']:.4f} | {r['nll_change']:+.4f} | "
            f"{100 * r['coverage_random']:.1f}% | {100 * r['coverage_block']:.1f}% | "
            f"{100 * r['coverage_change']:+.1f} pp |"
        )
    return "\n".join(lines)


def _markdown(df: pd.DataFrame) -> str:
    cols = [*(["rank"] if "rank" in df else []), *[c for c in df.columns if c != "rank"]]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for _, row in df[cols].iterrows():
        lines.append("| " + " | ".join(str(row[c]) for c in cols) + " |")
    return "\n".join(lines)
