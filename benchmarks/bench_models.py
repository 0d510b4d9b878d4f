"""The model comparison as a benchmark: every model on one split, plus GPyTorch SVGP as the peer.

Runs :func:`gpcore.compare.compare_models` (the same code as ``python -m gpcore compare``) and, on the
same training split and in the same process, fits GPyTorch's SVGP (m inducing points, batch 1024,
Adam 1e-2, same epochs and early stopping on validation NLL). Prints the ranked table and each
model's fit time divided by GPyTorch SVGP's.

    python benchmarks/bench_models.py                      # Puerto Rico 2023, all eight models
    python benchmarks/bench_models.py --data sample:missouri_2020Q4 --models dbk-rbf,svgp
    python benchmarks/bench_models.py --smoke              # synthetic, two tiny models, seconds (CI)
"""

from __future__ import annotations

import argparse
import math
import sys
import tempfile
import time

import numpy as np
import torch
from _peers import gpytorch_svgp

from gpcore import metrics as M
from gpcore.compare import compare_models
from gpcore.runs import RunConfig, prepare

DEFAULT_MODELS = "dbk-silu,dbk-rbf,svgp,ppgp,sv-dkl,softki,cagp,solvegp"


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


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--smoke", action="store_true", help="synthetic data, two tiny models (seconds)")
    ap.add_argument("--data", default="sample:puerto_rico")
    ap.add_argument("--quarter", default="2023")
    ap.add_argument("--y", default="download_mbps")
    ap.add_argument("--transform", default="log10")
    ap.add_argument("--strata", default="county_metro")
    ap.add_argument("--models", default=DEFAULT_MODELS)
    ap.add_argument("--svgp-m", type=int, default=512)
    ap.add_argument("--svgp-epochs", type=int, default=200)
    ap.add_argument("--out", help="where the runs and tables go (default: a temporary directory)")
    args = ap.parse_args(argv)
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
    return 0


if __name__ == "__main__":
    sys.exit(main())
