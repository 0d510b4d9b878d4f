"""Issue 14's bar: weighted vs unweighted models per measurement-count bin, and recalibration per stratum.

``weights`` mode fits each model twice on one seeded 8:1:1 split (without and with the weight column,
``recalibrate="none"``; ``vecchia`` and ``dbk-nn`` with the latent scale a random-split run cross-validates),
scores every test row with its own count, and reports NLL and 95 % coverage
overall and per count bin (1, 2-4, 5-16, >16) with two binomial standard errors; then the same
models after per-stratum recalibration on the validation split. ``recal`` mode reports coverage per
stratum without recalibration, with one global scale and with one scale per stratum.

    python benchmarks/bench_weights.py weights --data sample:puerto_rico --quarter 2023 --models dbk-rbf,svgp
    python benchmarks/bench_weights.py weights --data sample:missouri_2020Q4 --models dbk-rbf,svgp
    python benchmarks/bench_weights.py recal --data california.csv --y median_house_value \\
        --x longitude,latitude --strata column:coast --models dbk-rbf,svgp

(``california.csv``: california_housing_1990_blockgroups.csv (Pace & Barry 1997) with a ``coast`` column,
"inland" where ``ocean_proximity`` is INLAND, else "coastal"; ``--make-california OUT.csv --data SRC.csv``
writes it.)
``--smoke`` runs both modes on a small synthetic set in seconds (CI).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
from _harness import run_defaults

from gpcore import make_model
from gpcore import metrics as M
from gpcore.run.config import RunConfig
from gpcore.run.pipeline import prepare


def _row(label, pred, y, sel=None):
    """One table row of ``pred`` (a Prediction, Gaussian or with a noise shape) on the rows ``sel``."""
    p = pred if sel is None else pred.subset(sel)
    y = y if sel is None else y[sel]
    kw = {"shape": p.shape, "var_f": p.var_f}
    n = len(y)
    cov = M.coverage(p.mean, p.var_y, y, **kw)
    se = M.coverage_se(n)
    return {"group": label, "n": n, "nll": M.nll(p.mean, p.var_y, y, **kw), "coverage": cov, "two_se": 2 * se,
            "within_2se": abs(cov - 0.95) <= 2 * se, "pi_width_mean": float(p.width().mean())}


def _bins(pred, y, w, name):
    rows = [_row("all", pred, y)]
    labels = M.weight_bins(w, name)
    for b in M.WEIGHT_BINS:
        sel = labels == f"{name} {b[0]}"
        if sel.any():
            rows.append(_row(f"{name} {b[0]}", pred, y, sel))
    return rows


def _strata(pred, y, g):
    rows = [_row("all", pred, y)]
    for label in sorted(set(g.tolist())):
        rows.append(_row(label, pred, y, g == label))
    return rows


def _fit(name, prep, settings, weighted: bool, cfg):
    tr, va = prep.train_idx, prep.val_idx
    kw = {"weights": prep.weights[tr], "val_weights": prep.weights[va]} if weighted else {}
    model = make_model(name, **{"seed": 0, **run_defaults(name, cfg), **settings})
    t0 = time.perf_counter()
    model.fit(prep.X[tr], prep.y[tr], prep.X[va], prep.y[va], **kw)
    return model, time.perf_counter() - t0


def run_weights(cfg: RunConfig, models, settings, log=print) -> pd.DataFrame:
    prep = prepare(cfg)
    te, va = prep.test_idx, prep.val_idx
    w_te, y_te = prep.weights[te], prep.y[te]
    g_te = prep.strata[te] if prep.strata is not None else None
    log(f"{cfg.data} {cfg.quarter or ''}: train/val/test {len(prep.train_idx)}/{len(va)}/{len(te)}")
    rows = []
    for name in models:
        for weighted in (False, True):
            model, secs = _fit(name, prep, settings.get(name, {}), weighted, cfg)
            pred = model.predict(prep.X[te], weights=w_te if weighted else None)
            variant = "weighted" if weighted else "unweighted"
            for r in _bins(pred, y_te, w_te, cfg.weight):
                rows.append({"model": name, "variant": variant, "recal": "none", "fit_s": secs, **r})
            if prep.strata is not None and not model.train_info_.get("conditioned_on", {}).get("validation"):
                # vecchia / dbk-nn: the validation rows joined the posterior, so they cannot recalibrate it
                model.recalibrate(prep.X[va], prep.y[va], val_weights=prep.weights[va] if weighted else None,
                                  val_groups=prep.strata[va], kind="group")
                pr = model.predict(prep.X[te], weights=w_te if weighted else None, groups=g_te)
                for r in _bins(pr, y_te, w_te, cfg.weight):
                    rows.append({"model": name, "variant": variant, "recal": "group", "fit_s": secs, **r})
            extra = (f" tau2={model.nugget_variance:.4f} sigma2={model.measurement_noise_variance:.4f}"
                     if weighted else f" noise={model.noise_variance:.4f}")
            log(f"  {name} {variant}: {secs:.0f}s, epochs {model.train_info_.get('epochs_run')}{extra}")
    return pd.DataFrame(rows)


def run_recal(cfg: RunConfig, models, settings, log=print) -> pd.DataFrame:
    prep = prepare(cfg)
    te, va = prep.test_idx, prep.val_idx
    g_te, g_va, y_te = prep.strata[te], prep.strata[va], prep.y[te]
    log(f"{cfg.data}: train/val/test {len(prep.train_idx)}/{len(va)}/{len(te)}")
    rows = []
    for name in models:
        model, secs = _fit(name, prep, settings.get(name, {}), False, cfg)
        for kind in ("none", "global", "group"):
            if kind != "none":
                model.recalibrate(prep.X[va], prep.y[va], val_groups=g_va, kind=kind)
            pred = model.predict(prep.X[te], groups=g_te)
            for r in _strata(pred, y_te, g_te):
                rows.append({"model": name, "recal": kind, "fit_s": secs, **r})
        log(f"  {name}: {secs:.0f}s, scales {model.recal_['scales']} (global {model.recal_['global']:.3f})")
    return pd.DataFrame(rows)


def markdown(df: pd.DataFrame) -> str:
    fmt = df.copy()
    for c in ("nll", "pi_width_mean"):
        fmt[c] = fmt[c].map(lambda v: f"{v:.3f}")
    fmt["coverage"] = [f"{100 * c:.1f} ± {100 * s:.1f}{'' if ok else ' ✗'}"
                       for c, s, ok in zip(df["coverage"], df["two_se"], df["within_2se"], strict=True)]
    fmt["fit_s"] = fmt["fit_s"].map(lambda v: f"{v:.0f}")
    cols = [c for c in ("model", "variant", "recal", "group", "n", "nll", "coverage", "pi_width_mean", "fit_s")
            if c in fmt]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(str(v) for v in row) + " |" for row in fmt[cols].itertuples(index=False)]
    return "\n".join(lines)


def make_california(src: Path, out: Path) -> Path:
    df = pd.read_csv(src)
    df["coast"] = np.where(df["ocean_proximity"].eq("INLAND"), "inland", "coastal")
    df.to_csv(out, index=False)
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("mode", nargs="?", choices=("weights", "recal"), default="weights")
    p.add_argument("--data")
    p.add_argument("--quarter")
    p.add_argument("--y", default="download_mbps")
    p.add_argument("--x", help="coordinate columns 'lon,lat' when not auto-detected")
    p.add_argument("--transform", default="log10")
    p.add_argument("--weight", default="tests")
    p.add_argument("--strata", default="county_metro")
    p.add_argument("--models", default="dbk-rbf,svgp")
    p.add_argument("--set", action="append", default=[], help="model.key=value, e.g. svgp.epochs=50")
    p.add_argument("--out", help="write <out>.csv and <out>.md")
    p.add_argument("--make-california", help="write the California CSV with the coast column here and exit")
    p.add_argument("--smoke", action="store_true")
    a = p.parse_args(argv)
    if a.make_california:
        if not a.data:
            p.error("--make-california needs --data california_housing_1990_blockgroups.csv")
        print(make_california(Path(a.data), Path(a.make_california)))
        return 0
    settings: dict[str, dict] = {}
    for item in a.set:
        key, value = item.split("=", 1)
        name, k = key.split(".", 1)
        settings.setdefault(name, {})[k] = float(value) if "." in value or "e" in value else int(value)
    models = [m for m in a.models.split(",") if m]
    if a.smoke:
        small = {"epochs": 2, "rank": 8, "hidden": 8, "num_inducing": 8}
        smoke = {m: {k: v for k, v in small.items() if k in make_model(m).config.field_names()} for m in models}
        cfg = RunConfig(data="sample:synthetic", y="download_mbps", transform="log10", weight="tests",
                        strata="county_metro", model=models[0], grid_kind="none")
        print(markdown(run_weights(cfg, models, smoke)))
        print(markdown(run_recal(cfg, models, smoke)))
        return 0
    x = tuple(a.x.split(",")) if a.x else None
    strata = a.strata or None
    cfg = RunConfig(data=a.data, y=a.y, x=x, transform=a.transform, quarter=a.quarter,
                    weight=a.weight if a.mode == "weights" else None, strata=strata, model=models[0],
                    grid_kind="none")
    df = (run_weights if a.mode == "weights" else run_recal)(cfg, models, settings,
                                                             log=lambda m: print(m, file=sys.stderr))
    md = markdown(df)
    print(md)
    if a.out:
        Path(a.out + ".csv").parent.mkdir(parents=True, exist_ok=True)
        df.to_csv(a.out + ".csv", index=False)
        Path(a.out + ".md").write_text(md + "\n")
        Path(a.out + ".json").write_text(json.dumps({"argv": sys.argv[1:]}, indent=1))
    return 0 if not math.isnan(df["nll"].iloc[0]) else 1


if __name__ == "__main__":
    sys.exit(main())
