"""The model comparison as a benchmark: every model on one split, plus GPyTorch SVGP as the peer.

Runs :func:`gpcore.run.compare.compare_models` (the same code as ``python -m gpcore compare``) and, on the
same training split and in the same process, fits GPyTorch's SVGP (m inducing points, batch 1024,
Adam 1e-2, same epochs and early stopping on validation NLL). Prints the ranked table and each
model's fit time divided by GPyTorch SVGP's.

    python benchmarks/bench_models.py                      # Puerto Rico 2023, all eight models
    python benchmarks/bench_models.py --data sample:missouri_2020Q4 --models dbk-rbf,svgp
    python benchmarks/bench_models.py --smoke              # synthetic, two tiny models, seconds (CI)

``--data heaton`` is issue 13's gap benchmark: the Heaton et al. (2019) simulated temperatures
(``heaton_simulated_temps.parquet``: training = the 105,569 cells with ``MaskTemp``, test = the 44,431
cloud-masked cells scored against ``TrueTemp``). Each ``--models`` model (default vecchia,dbk-nn,dbk-rbf;
names not registered are skipped) is fitted with early stopping on a seeded 5 % of the training cells
(``--val random``, default, or ``--val block``: whole 10 km blocks, like the gaps), and GPBoost's Vecchia GP
(Matérn-3/2, 30 neighbours, package defaults; optional peer) on the same 95 %, in the same process. Prints
the paper's table: MAE, RMSPE, CRPS, interval score (INT), 95 % coverage (CVG), minutes (fit + predict),
in the data's units (no target transform), and the test NLL. ``--smoke`` also runs this on synthetic gaps (seconds).

    python benchmarks/bench_models.py --data heaton --models vecchia,dbk-rbf --subsample 5000
    python benchmarks/bench_models.py --data heaton --heaton /path/to/heaton_simulated_temps.parquet
"""

from __future__ import annotations

import argparse
import math
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from _harness import (
    feature_check_text,
    fit_predict,
    shared_data,
    smoke_settings,
    start,
    stderr,
)
from _peers import gpboost_available, gpboost_vecchia, gpytorch_svgp

from gpcore import metrics as M
from gpcore.run.compare import compare_models
from gpcore.run.config import RunConfig
from gpcore.run.pipeline import prepare

DEFAULT_MODELS = "dbk-silu,dbk-rbf,svgp,ppgp,sv-dkl,softki,cagp,solvegp"
HEATON_MODELS = "vecchia,dbk-nn,dbk-rbf"
HEATON_FILE = "heaton_simulated_temps.parquet"
HEATON_COLUMNS = ("Lon", "Lat", "MaskTemp", "TrueTemp")


def gpytorch_svgp_fit_seconds(prep, m: int, epochs: int, patience: int = 20, seed: int = 0) -> tuple[float, float]:
    """Fit GPyTorch SVGP on the run's training split; return (seconds, test NLL in transformed units)."""
    import gpytorch

    torch.manual_seed(seed)
    X, y = prep.X, prep.y
    lo, span = X[prep.train_idx].min(0), np.ptp(X[prep.train_idx], 0)
    span = np.where(span > 0, span, 1.0)
    ym, ys = y[prep.train_idx].mean(), y[prep.train_idx].std()

    def tx(idx):
        return torch.as_tensor(2 * (X[idx] - lo) / span - 1, dtype=torch.float32)

    def ty(idx):
        return torch.as_tensor((y[idx] - ym) / ys, dtype=torch.float32)

    Xtr, ytr, Xv, yv = tx(prep.train_idx), ty(prep.train_idx), tx(prep.val_idx), ty(prep.val_idx)
    Z = Xtr[torch.randperm(len(Xtr))[:m]].clone()

    model, lik = gpytorch_svgp(Z)
    mll = gpytorch.mlls.VariationalELBO(lik, model, num_data=len(ytr))
    opt = torch.optim.Adam([*model.parameters(), *lik.parameters()], lr=1e-2)
    best, stale, best_state = math.inf, 0, None
    t0 = time.perf_counter()
    for _ in range(epochs):
        model.train()
        lik.train()
        for idx in torch.split(torch.randperm(len(ytr)), 1024):
            opt.zero_grad()
            (-mll(model(Xtr[idx]), ytr[idx])).backward()
            opt.step()
        model.eval()
        lik.eval()
        with torch.no_grad():
            p = lik(model(Xv))
            v = M.nll(p.mean.numpy(), p.variance.numpy(), yv.numpy())
        if v < best - 1e-7:
            best, stale = v, 0
            best_state = ({k: t.clone() for k, t in model.state_dict().items()},
                          {k: t.clone() for k, t in lik.state_dict().items()})
        else:
            stale += 1
            if stale >= patience:
                break
    fit_s = time.perf_counter() - t0
    model.load_state_dict(best_state[0])
    lik.load_state_dict(best_state[1])
    with torch.no_grad():
        p = lik(model(tx(prep.test_idx)))
        nll = M.nll(p.mean.numpy() * ys + ym, p.variance.numpy() * ys**2, y[prep.test_idx])
    return fit_s, nll


def load_heaton(path) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``(X_train, y_train, X_test, y_test)`` of the Heaton simulated data: training = rows with ``MaskTemp``,
    test = the masked rows with their ``TrueTemp``."""
    df = pd.read_parquet(path)
    missing = [c for c in HEATON_COLUMNS if c not in df.columns]
    if missing:
        raise SystemExit(f"{path}: column(s) {missing} missing; expected {list(HEATON_COLUMNS)} "
                         "(the Heaton et al. simulated temperatures, see ../shared/data/PROVENANCE.md)")
    X = df[["Lon", "Lat"]].to_numpy(np.float64)
    obs = df["MaskTemp"].notna().to_numpy()
    test_y = df["TrueTemp"].to_numpy(np.float64)[~obs]
    if not np.all(np.isfinite(test_y)):
        bad = np.flatnonzero(~obs)[~np.isfinite(test_y)]
        raise SystemExit(f"{path}: column 'TrueTemp' is missing at masked row(s) {bad[:8].tolist()}; every test "
                         "row needs its true value")
    return X[obs], df["MaskTemp"].to_numpy(np.float64)[obs], X[~obs], test_y


def synthetic_gaps(seed: int = 0, nx: int = 60, ny: int = 36, clouds: int = 5):
    """A small Heaton-like set for ``--smoke``: a smooth field plus noise on a grid over the Heaton box, with
    disc-shaped 'clouds' whose cells are the test set. Same return as :func:`load_heaton`."""
    rng = np.random.default_rng(seed)
    lon, lat = np.meshgrid(np.linspace(-95.9, -91.3, nx), np.linspace(34.3, 37.1, ny))
    X = np.column_stack([lon.ravel(), lat.ravel()])
    truth = 44 + 3 * np.sin(1.3 * X[:, 0]) * np.cos(1.7 * X[:, 1]) + 0.8 * X[:, 1] - 0.8 * 35.7
    y = truth + 0.3 * rng.normal(size=len(X))
    centres = np.column_stack([rng.uniform(-95.5, -91.7, clouds), rng.uniform(34.6, 36.8, clouds)])
    gap = (np.hypot(X[:, None, 0] - centres[:, 0], X[:, None, 1] - centres[:, 1]) < 0.45).any(1)
    return X[~gap], y[~gap], X[gap], y[gap]


def heaton_validation(X, how: str, seed: int, frac: float = 0.05) -> np.ndarray:
    """Boolean mask of the validation rows among the training cells: a seeded random ``frac`` (``random``) or
    whole 10 km blocks adding up to about ``frac`` (``block``, :func:`gpcore.data.block_split`)."""
    from gpcore import data as D

    if how == "random":
        _, va, _ = D.random_split(len(X), seed=seed, fractions=(1 - frac, frac, 0.0))
    else:
        _, va, _ = D.block_split(X[:, 0], X[:, 1], block_km=10.0, seed=seed, fractions=(1 - frac, frac, 0.0))
    mask = np.zeros(len(X), bool)
    mask[va] = True
    return mask


def heaton_markdown(df: pd.DataFrame) -> str:
    cols = ["model", "n_train", "MAE", "RMSPE", "CRPS", "INT", "CVG", "minutes", "fit s", "predict s", "NLL"]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in df.itertuples(index=False):
        lines.append(f"| {r.model} | {r.n_train} | {r.mae:.3f} | {r.rmspe:.3f} | {r.crps:.3f} | "
                     f"{r.interval_score:.3f} | {100 * r.coverage:.1f} % | {r.minutes:.2f} | {r.fit_s:.1f} | "
                     f"{r.predict_s:.1f} | {r.nll:.3f} |")
    return "\n".join(lines)


def peer_shapes(text: str) -> list[float]:
    """``--peer-shapes``: GPBoost supports Matérn smoothness 0.5, 1.5 and 2.5 (and others, slower)."""
    try:
        shapes = [float(t) for t in text.split(",") if t.strip()]
    except ValueError:
        raise SystemExit(f"--peer-shapes {text!r}: expected comma-separated numbers such as 1.5 or 0.5,1.5") from None
    if not shapes or min(shapes) <= 0:
        raise SystemExit(f"--peer-shapes {text!r}: give at least one positive Matérn smoothness, e.g. 0.5,1.5")
    return shapes


def run_heaton(args, smoke: bool = False) -> int:
    """Issue 13's gap benchmark (module docstring); ``smoke``: synthetic gaps, tiny models."""
    if smoke:
        Xo, yo, Xt, yt = synthetic_gaps(args.seed)
        source = "synthetic gaps (smoke)"
    else:
        path = Path(args.heaton) if args.heaton else shared_data(HEATON_FILE)
        if not path.is_file():
            print(f"Heaton data not found at {path}: skipping (pass --heaton PATH or set UA_SHARED_DATA to the "
                  f"folder holding {HEATON_FILE})")
            return 0
        Xo, yo, Xt, yt = load_heaton(path)
        source = str(path)
    n_obs = len(yo)
    if args.subsample and args.subsample < n_obs:
        keep = np.sort(np.random.default_rng(args.seed).choice(n_obs, args.subsample, replace=False))
        Xo, yo = Xo[keep], yo[keep]
    val = heaton_validation(Xo, args.val, args.seed)
    Xtr, ytr, Xva, yva = Xo[~val], yo[~val], Xo[val], yo[val]
    models, sets = start((args.models or HEATON_MODELS), args.set)
    print(f"Heaton gaps: {source}; {n_obs} observed cells"
          + (f", subsample {len(yo)} (seed {args.seed})" if len(yo) < n_obs else "")
          + f"; validation {val.sum()} ({args.val}, seed {args.seed}), fit on {len(ytr)}; test {len(yt)} masked cells;"
          f" torch {torch.get_num_threads()} thread(s)")
    rows = []

    def add(name, r):
        secs = r["fit_seconds"] + r["predict_seconds"]
        rows.append({"model": name, "n_train": len(ytr), **M.heaton_scores(r["mean"], r["var_y"], yt),
                     "nll": M.nll(r["mean"], r["var_y"], yt), "minutes": secs / 60, "fit_s": r["fit_seconds"],
                     "predict_s": r["predict_seconds"]})
        stderr(f"  {name}: fit {r['fit_seconds']:.1f} s, predict {r['predict_seconds']:.1f} s"
               + feature_check_text(r.get("model")))

    for name in models:
        settings = {**(smoke_settings(name) if smoke else {}), **sets.get(name, {})}
        add(name, fit_predict(name, settings, Xtr, ytr, Xva, yva, Xt, seed=args.seed))
    if args.no_peer:
        print("--no-peer: no GPBoost row (compare with a run that has one)")
    elif gpboost_available():
        for shape in peer_shapes(args.peer_shapes):
            name = "GPBoost vecchia" if shape == 1.5 else f"GPBoost vecchia (Matérn {shape:g})"
            # every labelled cell the gpcore models were given (training + validation), as its users fit it
            add(name, gpboost_vecchia(Xo, yo, Xt, shape=shape))
    else:
        print("GPBoost not installed (pip install gpboost): no peer row")
    table = pd.DataFrame(rows)
    md = heaton_markdown(table)
    print(md)
    if args.out and not smoke:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        table.to_csv(out / "heaton.csv", index=False)
        (out / "heaton.md").write_text(md + "\n")
    return 0 if np.isfinite(table[["crps", "nll"]].to_numpy()).all() else 1


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--smoke", action="store_true", help="synthetic data, two tiny models (seconds)")
    ap.add_argument("--data", default="sample:puerto_rico")
    ap.add_argument("--quarter", default="2023")
    ap.add_argument("--y", default="download_mbps")
    ap.add_argument("--transform", default="log10")
    ap.add_argument("--strata", default="county_metro")
    ap.add_argument("--models", default=None,
                    help=f"comma-separated model names (default {DEFAULT_MODELS}; with --data heaton {HEATON_MODELS})")
    ap.add_argument("--svgp-m", type=int, default=512)
    ap.add_argument("--svgp-epochs", type=int, default=200)
    ap.add_argument("--out", help="where the runs and tables go (default: a temporary directory)")
    ap.add_argument("--heaton", help=f"--data heaton: the file (default $UA_SHARED_DATA/{HEATON_FILE}, else "
                    f"../shared/data/{HEATON_FILE} beside the repository)")
    ap.add_argument("--subsample", type=int, default=0, help="--data heaton: this many training cells (seeded)")
    ap.add_argument("--val", choices=("random", "block"), default="random",
                    help="--data heaton: validation cells, a seeded random 5 %% or 10 km blocks adding up to 5 %%")
    ap.add_argument("--seed", type=int, default=0, help="--data heaton: seed of subsample, validation and models")
    ap.add_argument("--set", action="append", default=[], help="--data heaton: MODEL.KEY=VALUE, e.g. vecchia.epochs=50")
    ap.add_argument("--no-peer", action="store_true", help="--data heaton: skip GPBoost (variants of gpcore models)")
    ap.add_argument("--peer-shapes", default="1.5",
                    help="--data heaton: GPBoost's Matérn smoothness, comma-separated (1.5 = the issue-13 reference; "
                         "0.5 = exponential, to compare with a gpcore matern12 fit)")
    args = ap.parse_args(argv)
    if args.data == "heaton" and not args.smoke:
        return run_heaton(args)
    args.models = args.models or DEFAULT_MODELS
    settings = {}
    if args.smoke:
        args.data, args.quarter, args.strata, args.models = "sample:synthetic", None, "column:county_metro", "dbk,svgp"
        settings = {"epochs": 2, "batch_size": 512}
        args.svgp_m, args.svgp_epochs = 32, 2
    base = RunConfig(data=args.data, y=args.y, transform=args.transform, quarter=args.quarter, strata=args.strata,
                     grid_kind="none", settings=settings)
    models = [m for m in args.models.split(",") if m]
    # torch imports torch._dynamo (seconds) the first time an optimizer is built: pay it outside the timings
    torch.optim.AdamW([torch.zeros(1, requires_grad=True)])
    overrides = {"dbk": {"rank": 16, "hidden": 16}, "svgp": {"num_inducing": 32}} if args.smoke else None
    with tempfile.TemporaryDirectory() as tmp:
        out = args.out or tmp
        table = compare_models(base, models, out, overrides=overrides, log=lambda m: None)
        prep = prepare(base)
        peer_s, peer_nll = gpytorch_svgp_fit_seconds(prep, args.svgp_m, args.svgp_epochs)
    overall = table[table.group == "all"].sort_values("rank")
    print(f"data {args.data} ({args.quarter or 'all'}), {len(prep.train_idx)} training points, "
          f"torch {torch.get_num_threads()} thread(s)")
    print(f"GPyTorch SVGP (m={args.svgp_m}): fit {peer_s:.1f} s, test NLL {peer_nll:.4f}")
    print(f"{'rank':>4} {'model':10} {'nll':>8} {'coverage':>9} {'fit s':>8} {'fit / GPyTorch SVGP':>20}")
    for _, r in overall.iterrows():
        print(f"{int(r['rank']):>4} {r['model']:10} {r['nll']:8.4f} {100 * r['coverage']:8.1f}% "
              f"{r['fit_seconds']:8.1f} {r['fit_seconds'] / peer_s:20.2f}")
    per = table[table.group != "all"][["model", "group", "n", "nll", "coverage", "pi_width_mean"]]
    print(per.to_string(index=False, float_format=lambda v: f"{v:.4f}"))
    if args.smoke:  # the Heaton gap benchmark on synthetic gaps
        args.models = "vecchia,dbk"
        return run_heaton(args, smoke=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
