"""Areal honesty (issue 25): are the joint posterior's intervals for a held-out area's average right?

Puerto Rico 2023 and Missouri 2020Q4 (bundled samples, log10 download Mbps, the ``tests`` weights) are cut into 10
km blocks and split by whole blocks (:func:`gpcore.data.block_split`, 8:1:1 by tiles; the project's own
``RunConfig(split="block")``). Each model is fitted on the training blocks with early stopping on the validation
blocks, with its defaults and what a block-split run adds (``vecchia`` and ``dbk-nn``: the latent scale
cross-validated on 10 km blocks, :func:`_harness.run_defaults`); the held-out blocks of several seeded splits
(``--seeds``) are pooled, since one split of
Puerto Rico holds only about a dozen scorable blocks. For every held-out (test) block with at least ``--min-tiles``
tiles the model predicts the *average* of its tiles' latent values from its joint posterior
(:func:`gpcore.posterior.joint_posterior`, ``linear``: mean ``a^T mu`` and variance ``a^T Sigma a`` with ``a = 1 /
n_B``), adds the noise variance of an average of ``n_B`` measurements (``sum_i noise_i / n_B^2``, each tile's own
noise: ``var_y - var_f`` of its prediction; a run's skewed noise has mean 0 and that variance, docs/calibration.md)
and scores the 95 % interval against the observed block average:
coverage (± two binomial SEs, ✗ outside) and the interval score (:func:`gpcore.metrics.interval_score`). Each
model's row ``(independent)`` uses the same means with the marginals' variances only (``sum_i a_i^2 var_f_i``): the
wrong answer, for contrast.

Target (issue 25): 95 % ± 2 binomial SE for the default model and ``dbk-nn``.

    python benchmarks/bench_areas.py                                   # pr, mo; dbk, dbk-nn, vecchia, svgp; seeds 0-2
    python benchmarks/bench_areas.py --data pr --models dbk --set dbk.epochs=50
    python benchmarks/bench_areas.py --smoke                           # synthetic, tiny models (seconds, CI)
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from _harness import add_race_args, fit_predict, report, run_defaults, smoke_settings, start, stderr
from bench_race import dataset_config

from gpcore import metrics as M
from gpcore.data import block_ids
from gpcore.posterior import joint_posterior
from gpcore.run.config import RunConfig
from gpcore.run.pipeline import prepare

Z95 = 1.959963984540054


def block_groups(X: np.ndarray, block_km: float, min_tiles: int) -> list[np.ndarray]:
    """Row indices of each block of ``X`` (lon, lat) with at least ``min_tiles`` rows."""
    ids = block_ids(X[:, 0], X[:, 1], block_km)
    _, inv, counts = np.unique(ids, return_inverse=True, return_counts=True)
    order = np.argsort(inv, kind="stable")
    bounds = np.cumsum(counts)[:-1]
    return [g for g in np.split(order, bounds) if g.size >= min_tiles]


def areal_scores(key: str, name: str, mean, var, target) -> dict:
    """Coverage (with its binomial SE) and interval score of the central 95 % intervals ``mean ± z sqrt(var)``."""
    n = len(target)
    half = Z95 * np.sqrt(var)
    cov = float(np.mean(np.abs(target - mean) <= half)) if n else float("nan")
    se = M.coverage_se(n) if n else float("nan")
    return {"data": key, "model": name, "blocks": n, "coverage": cov, "se": se,
            "ok": bool(abs(cov - 0.95) <= 2 * se) if n else False,
            "interval_score": M.interval_score(mean, var, target, 0.95) if n else float("nan"),
            "mean_width": float(np.mean(2 * half)) if n else float("nan")}


def areas_dataset(key: str, cfg: RunConfig, models, sets, args, smoke: bool = False) -> list[dict]:
    """Per model: the held-out blocks' ``(mean, joint variance, independent variance, target)`` of one split."""
    prep = prepare(cfg)
    tr, va, te = prep.train_idx, prep.val_idx, prep.test_idx
    X, y, w = prep.X, prep.y, prep.weights
    groups = block_groups(X[te], cfg.block_km, args.min_tiles)
    target = np.array([y[te][g].mean() for g in groups])
    stderr(f"{key}: {prep.source_label}, train/val/test {len(tr)}/{len(va)}/{len(te)} tiles ({cfg.block_km:g} km "
           f"blocks, seed {cfg.seed}); {len(groups)} test blocks with >= {args.min_tiles} tiles")
    wkw = {} if w is None else {"weights": w[tr], "val_weights": w[va], "test_weights": w[te]}
    out = {}
    for name in models:
        settings = {**run_defaults(name, cfg), **(smoke_settings(name) if smoke else {}), **sets.get(name, {})}
        r = fit_predict(name, settings, X[tr], y[tr], X[va], y[va], X[te], seed=cfg.seed, **wkw)
        model = r["model"]
        pred = model.predict(X[te], weights=w[te] if r["weighted"] else None)
        noise = np.maximum(pred.var_y - pred.var_f, 0.0)  # each tile's own measurement noise (a shape's variance)
        lin = [(g, np.full(g.size, 1.0 / g.size)) for g in groups]
        mean, var_f = joint_posterior(model).linear(X[te], lin)
        var_noise = np.array([noise[g].sum() / g.size**2 for g in groups])
        var_ind = np.array([pred.var_f[g].sum() / g.size**2 for g in groups])
        out[name] = (mean, var_f + var_noise, var_ind + var_noise, target)
        inside = [float(np.mean(np.abs(target - mean) <= Z95 * np.sqrt(v))) for v in out[name][1:3]]
        stderr(f"  {name}: fit {r['fit_seconds']:.1f} s, coverage {inside[0]:.3f} joint, {inside[1]:.3f} independent")
    return out


def markdown(df: pd.DataFrame) -> str:
    lines = ["| data | model | held-out blocks | 95 % coverage of the block average | interval score | mean width |",
             "|---|---|---|---|---|---|"]
    for r in df.itertuples(index=False):
        mark = "" if r.ok else " ✗"
        lines.append(f"| {r.data} | {r.model} | {r.blocks} | {100 * r.coverage:.1f} ± {200 * r.se:.1f}{mark} | "
                     f"{r.interval_score:.4f} | {r.mean_width:.4f} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", default="pr,mo", help="comma-separated, from pr, mo")
    ap.add_argument("--models", default="dbk,dbk-nn,vecchia,svgp")
    ap.add_argument("--block-km", type=float, default=10.0)
    ap.add_argument("--min-tiles", type=int, default=5, help="score blocks with at least this many test tiles")
    ap.add_argument("--seeds", default="0,1,2", help="block splits (and model seeds) whose held-out blocks are pooled")
    add_race_args(ap, "dbk.epochs=50", "synthetic data, tiny models")
    args = ap.parse_args(argv)
    models, sets = start(args.models, args.set)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        if args.smoke:
            args.min_tiles = 2
            configs = [("synthetic", RunConfig(data="sample:synthetic", y="download_mbps", transform="log10",
                                               weight="tests", grid_kind="none"))]
        else:
            configs = [(k, dataset_config(k, Path(tmp))) for k in args.data.split(",") if k]
        seeds = [int(v) for v in args.seeds.split(",") if v.strip()][: 1 if args.smoke else None]
        for key, cfg in configs:
            pooled: dict[str, list] = {}
            for seed in seeds:
                split = RunConfig.from_dict({**cfg.to_dict(), "split": "block", "block_km": args.block_km,
                                             "seed": seed})
                for name, parts in areas_dataset(key, split, models, sets, args, smoke=args.smoke).items():
                    pooled.setdefault(name, []).append(parts)
            for name, parts in pooled.items():
                mean, v_joint, v_ind, target = (np.concatenate(p) for p in zip(*parts, strict=True))
                rows.append(areal_scores(key, name, mean, v_joint, target))
                rows.append(areal_scores(key, f"{name} (independent)", mean, v_ind, target))
    df = pd.DataFrame(rows)
    header = (f"held-out {args.block_km:g} km blocks of the block splits with seeds {args.seeds} (pooled) with >= "
              f"{args.min_tiles} test tiles; the "
              f"95 % interval of each block's average (latent average + the noise of an average); each model with its "
              f"defaults, fitted on the training blocks, stopped on the validation blocks; torch "
              f"{torch.get_num_threads()} thread(s)")
    md = markdown(df)
    report(header, md, df, args.out)
    return 0 if np.isfinite(df["interval_score"]).all() else 1


if __name__ == "__main__":
    sys.exit(main())
