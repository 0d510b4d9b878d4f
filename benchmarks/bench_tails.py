"""Why a model's 95 % intervals miss on held-out spatial blocks: the shape of its standardised test errors.

For each ``--data`` set and ``--seeds`` split seed (``--split block`` by default: whole 10 km squares held out, as in
``bench_race.py``), the ``--model`` (default ``dbk-nn``, the app's default; its defaults, ``--set`` to change them) is
fitted on the training rows and stopped on the validation rows, which then join its posterior, exactly as
``bench_race.py`` does. On the test rows, with ``z = (y - mean) / sd`` (``sd`` for each row's own ``tests`` count):

* ``E[z^2]`` (1 when the predictive variance is right on average), skewness ``E[z^3]`` and kurtosis ``E[z^4]``;
* coverage of the central 50 / 80 / 90 / 95 / 99 % Gaussian intervals, and the two 2.5 % tails of the 95 % one
  (below / above), each against its Gaussian share;
* 95 % coverage in four bins of the latent share ``var_f / var_y`` (how much of a row's predictive variance is the
  model's uncertainty about f rather than measurement noise);
* ``c``: the scale of ``var_f`` that maximises the likelihood of the *validation* rows (predicted from the training
  rows alone, before they join), and the test coverage with ``var_f`` scaled by it — whether the validation blocks
  could have told the model its latent variance was off.

Method and findings: docs/benchmarks/race.md ("Why blocks are over-covered").

    python benchmarks/bench_tails.py --data pr,mo --seeds 0,1,2
    python benchmarks/bench_tails.py --smoke          # the bundled synthetic sample, tiny model (CI)
"""

from __future__ import annotations

import argparse
import dataclasses
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd
from _harness import add_race_args, report, smoke_settings, start, stderr
from bench_race import race_configs
from scipy.optimize import minimize_scalar
from scipy.stats import norm

from gpcore import make_model
from gpcore.run.pipeline import prepare

LEVELS = (0.5, 0.8, 0.9, 0.95, 0.99)


def latent_scale(pred, y) -> float:
    """The factor ``c`` of ``var_f`` maximising ``sum log N(y; mean, c var_f + (var_y - var_f))``."""
    noise = pred.var_y - pred.var_f

    def nll(log_c):
        v = np.exp(log_c) * pred.var_f + noise
        return float(np.mean(np.log(v) + (y - pred.mean) ** 2 / v))

    return float(np.exp(minimize_scalar(nll, bounds=(-3.0, 3.0), method="bounded").x))


def shape_row(key: str, seed: int, name: str, settings: dict, cfg) -> dict:
    prep = prepare(cfg)
    tr, va, te = prep.train_idx, prep.val_idx, prep.test_idx
    X, y, w = prep.X, prep.y, prep.weights

    def wt(idx):
        return None if w is None else w[idx]

    model = make_model(name, seed=seed, **{**settings, "condition_on_validation": False})
    model.fit(X[tr], y[tr], X[va], y[va], weights=wt(tr), val_weights=wt(va))
    c = latent_scale(model.predict(X[va], weights=wt(va)), y[va])
    model.condition_on(X[va], y[va], weights=wt(va))  # what condition_on_validation does after the fit
    p = model.predict(X[te], weights=wt(te))
    z = (y[te] - p.mean) / np.sqrt(p.var_y)
    q95 = norm.ppf(0.975)
    row = {"data": key, "seed": seed, "model": name, "n test": len(te), "E[z^2]": np.mean(z**2),
           "skew": np.mean(z**3), "kurtosis": np.mean(z**4)}
    for level in LEVELS:
        row[f"cov {level:g}"] = 100 * np.mean(np.abs(z) <= norm.ppf(0.5 + level / 2))
    row["below (2.5)"], row["above (2.5)"] = 100 * np.mean(z < -q95), 100 * np.mean(z > q95)
    share = p.var_f / p.var_y
    for lo, hi in ((0.0, 0.25), (0.25, 0.5), (0.5, 0.75), (0.75, 1.01)):
        sel = (share >= lo) & (share < hi)
        row[f"cov95 latent {lo:g}-{min(hi, 1):g} (n)"] = (
            f"{100 * np.mean(np.abs(z[sel]) <= q95):.1f} ({sel.sum()})" if sel.any() else "-")
    row["val c"] = c
    v = c * p.var_f + (p.var_y - p.var_f)
    row["cov95 with c"] = 100 * np.mean(np.abs(y[te] - p.mean) <= q95 * np.sqrt(v))
    stderr(f"{key} seed {seed}: E[z^2] {row['E[z^2]']:.3f}, cov95 {row['cov 0.95']:.1f} "
           f"(below {row['below (2.5)']:.2f} / above {row['above (2.5)']:.2f}), val c {c:.3f}")
    return row


def markdown(df: pd.DataFrame) -> str:
    """The table as markdown: numbers with three decimals, text as it is."""
    lines = ["| " + " | ".join(df.columns) + " |", "|" + "---|" * len(df.columns)]
    for r in df.itertuples(index=False):
        lines.append("| " + " | ".join(f"{v:.3f}" if isinstance(v, float) else str(v) for v in r) + " |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", default="pr,mo", help="comma-separated: pr, mo, california, turkey (as bench_race)")
    ap.add_argument("--model", default="dbk-nn", help="the gpcore model (default dbk-nn, the app's default)")
    ap.add_argument("--seeds", default="0", help="comma-separated split seeds")
    ap.add_argument("--split", choices=("random", "block"), default="block")
    ap.add_argument("--block-km", type=float, default=10.0)
    add_race_args(ap, example="dbk-nn.pred_neighbors=60")
    args = ap.parse_args(argv)
    names, sets = start(args.model, args.set)
    if not names:
        return 1
    name = names[0]
    settings = {**(smoke_settings(name) if args.smoke else {}), **sets.get(name, {})}
    seeds = [0] if args.smoke else [int(s) for s in args.seeds.split(",") if s]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for key, cfg in race_configs(args.data, args.smoke, Path(tmp)):
            for seed in seeds:
                cfg_s = dataclasses.replace(cfg, split=args.split, block_km=args.block_km, seed=seed)
                rows.append(shape_row(key, seed, name, settings, cfg_s))
    df = pd.DataFrame(rows)
    blocks = f" ({args.block_km:g} km blocks)" if args.split == "block" else ""
    header = (f"split {args.split}{blocks}; model {name} with its defaults{f' and {settings}' if settings else ''}; "
              "test rows, z = (y - mean) / sd; coverage and tails in %, the Gaussian shares are 50/80/90/95/99 and "
              "2.5/2.5")
    report(header, markdown(df), df, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
