"""One Vecchia log-likelihood evaluation at n = 100,000: gpcore's ``vecchia`` against GPBoost's.

Synthetic 2-D data (uniform inputs, a smooth field plus noise), Matérn-3/2, m = 30 neighbours, fixed
hyperparameters (no fitting). gpcore: time of the ordering + neighbour search (``_build``), of one
likelihood evaluation and of one evaluation with its gradient. GPBoost (``pip install gpboost``;
optional, never a gpcore dependency): the same approximation — the points passed already in gpcore's
maxmin order with ``vecchia_ordering="none"`` — so the two log-likelihoods must agree to rounding;
then its default (random ordering) model for timing. Run with ``OMP_NUM_THREADS=1`` for a fair
single-thread comparison.

    OMP_NUM_THREADS=1 python benchmarks/bench_vecchia.py            # n = 100,000, with GPBoost if installed
    OMP_NUM_THREADS=1 python benchmarks/bench_vecchia.py --smoke    # n = 2,000, gpcore only, seconds (CI)
    OMP_NUM_THREADS=1 python benchmarks/bench_vecchia.py --fit-puerto-rico   # fit both on Puerto Rico 2023

``--fit-puerto-rico`` fits gpcore's ``vecchia`` (with GPBoost's Matérn-3/2, then with its default Matérn-1/2;
early stopping on the validation split) and
GPBoost's Vecchia GP (Matérn-3/2, 30 neighbours, package defaults, a constant fixed effect) on the
training split of the README's comparison (log10 download Mbps, random 8:1:1, seed 0) and prints test
NLL, 95 % coverage and fit seconds of each.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from gpcore import make_model


def build(n: int, m: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    X = rng.uniform(0, 100, size=(n, 2))
    y = np.sin(X[:, 0] / 10) * np.cos(X[:, 1] / 15) + 0.3 * rng.normal(size=n)
    model = make_model("vecchia", kernel="matern32", neighbors=m, dtype="float64", device="cpu")  # as GPBoost's
    model.d_, model.n_train_ = 2, n
    model._set_scalers(X, y)
    Xs, ys = model.scale_x(X), model.scale_y(y)
    t0 = time.perf_counter()
    model.module_ = model._build(2, Xs, ys).to(dtype=model.dtype)
    t_build = time.perf_counter() - t0
    with torch.no_grad():  # fixed, non-default hyperparameters
        model.module_.raw_ell.fill_(-1.5)  # lengthscale ~0.2 of the [-1, 1] box
        model.module_.raw_outputscale.fill_(0.5)
        model.module_.raw_noise.fill_(-1.0)
        model.module_.mu0.fill_(0.1)
    return model, t_build


def fit_puerto_rico() -> None:
    from gpcore import metrics as M
    from gpcore.run.config import RunConfig
    from gpcore.run.pipeline import prepare

    prep = prepare(RunConfig(data="sample:puerto_rico", y="download_mbps", transform="log10", quarter="2023",
                             strata="county_metro", grid_kind="none"))
    X, y, tr, va, te = prep.X, prep.y, prep.train_idx, prep.val_idx, prep.test_idx

    def report(label, mean, var_y, seconds):
        sd = np.sqrt(var_y)
        cover = np.mean(np.abs(y[te] - mean) <= 1.959963984540054 * sd)
        print(f"{label}: test NLL {M.nll(mean, var_y, y[te]):.4f}, 95 % coverage {100 * cover:.1f} %, "
              f"fit {seconds:.0f} s ({len(tr)} training points)")

    for kernel in ("matern32", "matern12"):  # GPBoost's kernel, then gpcore's default
        t0 = time.perf_counter()
        model = make_model("vecchia", kernel=kernel).fit(X[tr], y[tr], X[va], y[va])
        t_fit = time.perf_counter() - t0
        p = model.predict(X[te])
        report(f"gpcore vecchia ({kernel})", p.mean, p.var_y, t_fit)
    from _peers import gpboost_available, gpboost_vecchia

    if not gpboost_available():
        print("GPBoost not installed (pip install gpboost): skipping the comparison")
        return
    q = gpboost_vecchia(X[tr], y[tr], X[te])
    report("GPBoost vecchia", q["mean"], q["var_y"], q["fit_seconds"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=100_000)
    ap.add_argument("--m", type=int, default=30)
    ap.add_argument("--smoke", action="store_true", help="n = 2,000, gpcore only (seconds)")
    ap.add_argument("--fit-puerto-rico", action="store_true", help="fit both models on Puerto Rico 2023 instead")
    args = ap.parse_args()
    if args.fit_puerto_rico:
        fit_puerto_rico()
        return
    n = 2000 if args.smoke else args.n
    model, t_build = build(n, args.m)
    mod = model.module_
    print(f"n = {n}, m = {args.m}, torch threads = {torch.get_num_threads()}")
    print(f"gpcore  ordering + neighbours: {t_build:.2f} s")
    with torch.no_grad():
        t0 = time.perf_counter()
        ll = model.log_likelihood().item()
        t_ll = time.perf_counter() - t0
    print(f"gpcore  log-likelihood: {ll:.6f} (standardised units)  one evaluation {t_ll:.2f} s")
    mod.zero_grad()
    t0 = time.perf_counter()
    model._step(mod.X_train, mod.y_train, n)
    print(f"gpcore  evaluation + gradient: {time.perf_counter() - t0:.2f} s")
    if args.smoke:
        return
    try:
        import gpboost as gpb
    except ImportError:
        print("GPBoost not installed (pip install gpboost): skipping the comparison")
        return
    coords = mod.X_train.numpy()  # gpcore's maxmin order, scaled inputs
    z = (mod.y_train - mod.mu0).detach().numpy()
    cov_pars = np.array([mod.noise.item(), mod.outputscale.item(), mod.lengthscale[0].item()])
    for label, ordering in (("same order", "none"), ("default random order", "random")):
        t0 = time.perf_counter()
        gp = gpb.GPModel(gp_coords=coords, cov_function="matern", cov_fct_shape=1.5, likelihood="gaussian",
                         gp_approx="vecchia", num_neighbors=args.m, vecchia_ordering=ordering)
        t_b = time.perf_counter() - t0
        t0 = time.perf_counter()
        nll = gp.neg_log_likelihood(cov_pars=cov_pars, y=z)
        t_e = time.perf_counter() - t0
        print(f"GPBoost ({label}) setup {t_b:.2f} s, log-likelihood {-nll:.6f}, one evaluation {t_e:.2f} s"
              + (f", |difference| {abs(-nll - ll):.2e}" if ordering == "none" else ""))


if __name__ == "__main__":
    main()
