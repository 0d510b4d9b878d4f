"""The posterior of the change between two times, per place, from the *joint* posterior (``python -m gpcore change``).

For a run with time as an input (``RunConfig.time_input``) and places ``x`` (the run's grid cells), the change
``D(x) = f(x, t2) - f(x, t1)`` of the latent field is Gaussian with

    E[D] = m(x, t2) - m(x, t1),      Var[D] = v1 + v2 - 2 c12,

where ``v1, v2`` are the posterior variances at ``(x, t1)``, ``(x, t2)`` and ``c12`` their posterior covariance,
from the joint posterior of the two places. Two independent marginals would drop ``-2 c12`` and overstate the
uncertainty of a change wherever the field is persistent in time. ``P(D > 0) = Phi(E[D] / sd[D])``.

For ``vecchia`` and ``dbk-nn`` both places of a cell condition on one shared set of training responses
(:mod:`gpcore.models.vecchia_pairs`: mean and variance from that one conditional). Other models use
``model.posterior_cov`` and their predictive means; nothing ``n x n`` is formed: the places go in chunks of ``chunk``
cells, each chunk's ``2 chunk`` places ``(x, t1), (x, t2)`` in one ``posterior_cov`` call, from which only the
per-cell ``2 x 2`` blocks are kept. A chunk takes every ``K``-th cell (``K`` = the number of chunks), so its cells lie
far apart and each place's nearest other place in the chunk is its own partner in time (the joint Vecchia posterior
conditions on it directly). Both exact at ``m = n - 1``. Formula and units: docs/methods/spacetime.md, "The change
posterior".

That is the change at one set of hyperparameters. :func:`change_posterior` (what the CLI and the app show) averages it
over the hyperparameters' posterior where the model has one (``vecchia``, ``dbk-nn`` without features:
:mod:`gpcore.models.vecchia_hyper`, REML and its Laplace approximation): ``hyper_draws`` models at seeded draws, each
its own joint posterior; the change is the mixture of their Gaussians: ``P(D > 0)`` the average of the draws'
``Phi(E_k / sd_k)``, mean and sd the mixture's, the interval its quantiles; where that posterior is narrow
(:data:`NARROW_SD`: large data sets) the change at its REML mode alone (docs/methods/spacetime.md, "Hyperparameter
uncertainty").
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy.stats import norm

from gpcore.errors import ConfigError, DataError, RunError

#: cells per posterior_cov call (2 x CHUNK places; a 2 CHUNK square matrix)
CHUNK = 256
#: hyperparameter draws a change averages over (0: the fitted hyperparameters plugged in)
HYPER_DRAWS = 16
#: the hyperparameters' posterior is narrow, and the change is taken at its REML mode alone, when every sd of theta
#: (log units) is below this: on 116,406 Puerto Rico rows (every sd <= 0.036) the 16 draws' P is within 0.006 of the
#: mode's, at 16 times the cost; on a few hundred rows (sd 0.15-0.45) the averaging is what calibrates the change
NARROW_SD = 0.05
COLUMNS = ("cell_id", "lon", "lat", "change_mean", "change_sd", "change_lo", "change_hi", "p_increase")


def change_moments(model, X, t1: float, t2: float, chunk: int = CHUNK, via: str = "auto",
                   neighbors: tuple | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Mean and variance of ``f(x, t2) - f(x, t1)`` at each row of ``X`` (``n x 2``: the space columns) for a model
    whose last input is time, in the model's (transformed) units; shapes ``(n,)``. ``t1``, ``t2`` in decimal years.

    ``via="pairs"`` (``"auto"`` where the model has it: ``vecchia``, ``dbk-nn``): each cell's two places conditioned
    on one shared set of training responses (:mod:`gpcore.models.vecchia_pairs`), mean and variance from that one
    conditional. ``via="joint"`` (``"auto"`` otherwise): means the model's predictive
    means, the variance ``v1 + v2 - 2 c12`` from its joint posterior (:meth:`posterior_cov` over the ``2 x chunk``
    places of each chunk of cells), floored at 0. ``neighbors``: the pairs' :func:`_pair_neighbors` when the caller
    has them (they do not depend on the hyperparameters); used by the pairs only.
    """
    from gpcore.models import vecchia_pairs

    if via not in ("auto", "pairs", "joint"):
        raise ConfigError(f"via must be 'auto', 'pairs' or 'joint', got {via!r}")
    if via == "pairs" and not vecchia_pairs.supports(model):
        raise ConfigError(f"{type(model).__name__} has no pair posterior (vecchia, dbk-nn)")
    X = np.asarray(X, dtype=np.float64)
    if X.ndim != 2 or X.shape[1] + 1 != getattr(model, "d_", X.shape[1] + 1):
        raise DataError(f"places must have the model's space columns ({getattr(model, 'd_', 3) - 1}), got shape "
                        f"{X.shape}")
    if chunk < 1:
        raise ConfigError(f"chunk must be >= 1, got {chunk}")
    n = X.shape[0]
    X1, X2 = _places(X, t1, t2)
    if via == "pairs" or (via == "auto" and vecchia_pairs.supports(model)):
        mu, C = vecchia_pairs.pair_moments(model, X1, X2, neighbors=neighbors)
        return mu[:, 1] - mu[:, 0], np.maximum(C[:, 0, 0] + C[:, 1, 1] - 2.0 * C[:, 0, 1], 0.0)
    mean = model.predict(X2).mean - model.predict(X1).mean
    var = np.empty(n)
    k = max(1, math.ceil(n / chunk))
    for j in range(k):  # chunk j: cells j, j + k, j + 2k, ... (spread out)
        idx = np.arange(j, n, k)
        if not len(idx):
            continue
        c = len(idx)
        C = model.posterior_cov(np.vstack([X1[idx], X2[idx]]))
        d = np.diag(C)
        var[idx] = d[:c] + d[c:] - 2.0 * C[np.arange(c), c + np.arange(c)]
    return mean, np.maximum(var, 0.0)


def _places(X, t1: float, t2: float) -> tuple[np.ndarray, np.ndarray]:
    """The places ``(x, t1)`` and ``(x, t2)`` of every row ``x`` of ``X`` (space columns)."""
    X = np.asarray(X, dtype=np.float64)
    return tuple(np.column_stack([X, np.full(X.shape[0], float(t))]) for t in (t1, t2))


def _pair_neighbors(model, X, t1: float, t2: float) -> tuple | None:
    """What every draw of the hyperparameters shares in :func:`change_moments`: the pairs' training neighbours
    (:func:`gpcore.models.vecchia_pairs.pair_neighbors`), or ``None`` where the change does not take the pairs."""
    from gpcore.models import vecchia_pairs

    return vecchia_pairs.pair_neighbors(model, *_places(X, t1, t2)) if vecchia_pairs.supports(model) else None


def p_increase(mean, var) -> np.ndarray:
    """``P(D > 0) = Phi(mean / sd)`` of a Gaussian change with ``mean`` and variance ``var`` (shapes ``(n,)``); where
    ``var = 0`` the sign of ``mean`` decides (1/2 when ``mean = 0``)."""
    mean, sd = np.asarray(mean, dtype=np.float64), np.sqrt(np.asarray(var, dtype=np.float64))
    return np.where(sd > 0, norm.cdf(mean / np.where(sd > 0, sd, 1.0)), 0.5 + 0.5 * np.sign(mean))


@dataclass
class ChangeResult:
    """A change table (:data:`COLUMNS`) and what its numbers are."""

    table: pd.DataFrame
    t_from: str
    t_to: str
    units: str
    level: float
    hyper: str = ""


@dataclass
class ChangePosterior:
    """The change ``D(x)`` per place: mixture ``mean`` and ``sd``, central ``level`` interval ``lo``..``hi``, ``p`` =
    ``P(D > 0)`` (shapes ``(n,)``), and how the hyperparameters entered (``hyper``: text; ``draws``: 0 = the fitted
    ones plugged in, 1 = the REML mode alone)."""

    mean: np.ndarray
    sd: np.ndarray
    lo: np.ndarray
    hi: np.ndarray
    p: np.ndarray
    draws: int
    hyper: str


def change_posterior(model, X, t1: float, t2: float, level: float = 0.95, chunk: int = CHUNK,
                     hyper_draws: int = HYPER_DRAWS, seed: int = 0) -> ChangePosterior:
    """The change ``f(x, t2) - f(x, t1)`` at each row of ``X`` (space columns), averaged over ``hyper_draws`` seeded
    draws of the hyperparameters (module docstring) where the model has their posterior, at its REML mode alone where
    that posterior is narrow (:data:`NARROW_SD`; ``draws`` 1), else (or with ``hyper_draws=0``) at the fitted ones
    (:func:`change_moments`)."""
    from gpcore.models import vecchia_hyper

    if not 0 < level < 1:
        raise ConfigError(f"level must be in (0, 1), got {level}")
    if hyper_draws < 0:
        raise ConfigError(f"hyper_draws must be >= 0, got {hyper_draws}")
    means = None
    why = "" if not hyper_draws else f" ({type(model).__name__} has no hyperparameter posterior)"
    if hyper_draws and vecchia_hyper.supports(model):
        try:
            post = vecchia_hyper.hyper_posterior(model)
            if not (np.isfinite(post.mode).all() and np.isfinite(post.cov).all()):
                raise ValueError("a non-finite REML mode or covariance")
            narrow = float(np.sqrt(np.diag(post.cov)).max()) < NARROW_SD
            nb = _pair_neighbors(model, X, t1, t2)  # searched once: the draws share the inputs' neighbours
            models = ([vecchia_hyper.at_theta(model, post.mode)] if narrow
                      else vecchia_hyper.draws(model, hyper_draws, seed, post))
            parts = [change_moments(m, X, t1, t2, chunk, neighbors=nb) for m in models]
            means = np.stack([m for m, _ in parts], 1)
            sds = np.sqrt(np.stack([v for _, v in parts], 1))
            if not (np.isfinite(means).all() and np.isfinite(sds).all()):
                raise ValueError("a draw's change is not finite")
            fit = f"{'converged' if post.converged else 'not converged'} in {post.iterations} iterations"
            hyper = (f"at the hyperparameters' REML mode (their posterior is narrow, every sd below {NARROW_SD} in "
                     f"log units, so averaging over its draws would move P by about 0.01 at most; {fit})" if narrow
                     else f"averaged over {hyper_draws} draws of the hyperparameters (REML, Laplace; {fit})")
            draws = 1 if narrow else hyper_draws
        except (RuntimeError, ValueError, np.linalg.LinAlgError) as e:  # a numerical failure: keep the plug-in
            means, why = None, f" (averaging over the hyperparameters failed: {e})"
    if means is None:
        mean, var = change_moments(model, X, t1, t2, chunk)
        means, sds = mean[:, None], np.sqrt(var)[:, None]
        hyper, draws = f"at the fitted hyperparameters{why}", 0
    mean = means.mean(1)
    var = np.maximum((sds**2 + means**2).mean(1) - mean**2, 0.0)
    p = p_increase(means, sds**2).mean(1)
    a = (1 - level) / 2
    return ChangePosterior(mean, np.sqrt(var), mixture_quantile(means, sds, a), mixture_quantile(means, sds, 1 - a),
                           p, draws, hyper)


def mixture_quantile(means, sds, q: float, iterations: int = 60) -> np.ndarray:
    """The ``q``-quantile of each row's equal-weight Gaussian mixture (``means``, ``sds``: ``n x K``; a zero sd is a
    point mass), by bisection (``iterations`` halvings of the bracket; one component: ``mean + sd z_q`` exactly)."""
    means, sds = np.asarray(means, dtype=np.float64), np.asarray(sds, dtype=np.float64)
    if means.shape[1] == 1:
        return means[:, 0] + sds[:, 0] * float(norm.ppf(q))
    z = float(norm.ppf(q))
    lo = (means + sds * min(z, 0.0) - 1e-12).min(1) - 1e-12
    hi = (means + sds * max(z, 0.0) + 1e-12).max(1) + 1e-12
    for _ in range(iterations):
        mid = 0.5 * (lo + hi)
        below = _mixture_cdf(mid, means, sds) < q
        lo, hi = np.where(below, mid, lo), np.where(below, hi, mid)
    return 0.5 * (lo + hi)


def _mixture_cdf(x, means, sds) -> np.ndarray:
    d = x[:, None] - means
    safe = np.where(sds > 0, sds, 1.0)
    return np.where(sds > 0, norm.cdf(d / safe), (d >= 0).astype(float)).mean(1)


def change_table(model, cells, t1: float, t2: float, level: float = 0.95, chunk: int = CHUNK,
                 hyper_draws: int = HYPER_DRAWS) -> pd.DataFrame:
    """:data:`COLUMNS` per cell of ``cells`` (a frame with ``lon``, ``lat`` and optionally ``cell_id``): the change's
    mean, sd, central ``level`` interval and ``p_increase = P(change > 0)`` of :func:`change_posterior` (1/2 where
    sd = 0 and mean = 0); ``table.attrs["hyper"]`` says how the hyperparameters entered."""
    X = cells[["lon", "lat"]].to_numpy(dtype=np.float64)
    c = change_posterior(model, X, t1, t2, level, chunk, hyper_draws)
    ids = cells["cell_id"].to_numpy() if "cell_id" in cells.columns else np.arange(len(X))
    out = pd.DataFrame({"cell_id": ids, "lon": X[:, 0], "lat": X[:, 1], "change_mean": c.mean, "change_sd": c.sd,
                        "change_lo": c.lo, "change_hi": c.hi, "p_increase": c.p})
    out.attrs["hyper"] = c.hyper
    return out


def run_change_table(run_dir, model, cells, t1: float, t2: float, level: float = 0.95, chunk: int = CHUNK,
                     hyper_draws: int = HYPER_DRAWS) -> pd.DataFrame:
    """:func:`change_table` for the model of the run at ``run_dir``, with the hyperparameters' posterior kept in the
    run (``hyper_posterior.json``, :mod:`gpcore.run.rundir`): read back when it was computed from this model, else
    computed by the first change and written, so that later changes of the run, in any process (another pair of
    quarters, the CLI after the app), skip the REML fit (on 116,406 rows: 88 s of the first change's 94 s)."""
    from gpcore.models import vecchia_hyper
    from gpcore.run import rundir

    uses = hyper_draws > 0 and vecchia_hyper.supports(model)
    stored = vecchia_hyper.from_record(model, rundir.read_hyper(run_dir)) if uses else None
    if stored is not None and vecchia_hyper.cached(model) is None:
        vecchia_hyper.remember(model, stored)
    table = change_table(model, cells, t1, t2, level, chunk, hyper_draws)
    post = vecchia_hyper.cached(model) if uses and stored is None else None  # None too where the REML fit failed
    if post is not None and np.isfinite(post.mode).all() and np.isfinite(post.cov).all():
        rundir.write_hyper(run_dir, vecchia_hyper.to_record(model, post))
    return table


def units_text(cfg: dict) -> str:
    """What a change's numbers are in, for a run's config (its target and transform)."""
    y, tr = cfg.get("y", "the target"), cfg.get("transform", "identity")
    if tr == "log10":
        return (f"log10({y}) units: change_mean is log10 of the ratio t2/t1 (0.1 = x1.26, 0.3 = x2.0; "
                f"10**change_mean is the ratio of the medians)")
    if tr == "log":
        return f"natural-log({y}) units: change_mean is ln of the ratio t2/t1 (exp(change_mean) is the ratio)"
    return f"{y} units"


def run_change(run_dir, t_from: str, t_to: str, level: float = 0.95, chunk: int = CHUNK,
               hyper_draws: int = HYPER_DRAWS) -> ChangeResult:
    """The change between quarters ``t_from`` and ``t_to`` (``"2019Q4"``) at every grid cell of a stored run with
    time as an input. Quarters outside the run's data are allowed (the GP extrapolates; the interval says how well).
    Errors name the flags ``--from`` / ``--to``."""
    from gpcore.data.temporal import parse_quarter
    from gpcore.run import rundir
    from gpcore.run.store import load_run

    t1, t2 = parse_quarter(t_from, "--from"), parse_quarter(t_to, "--to")
    if t1 == t2:
        raise DataError(f"--from {t_from} and --to {t_to} are the same quarter; give two different quarters")
    manifest, model = load_run(run_dir)
    cfg = manifest["config"]
    if not cfg.get("time_input"):
        raise RunError(f"run '{run_dir}' was not fitted with time as an input, so it has no change between "
                       "quarters; fit it with --time-input (e.g. --quarter 2019Q1:2023Q4 --time-input)")
    cells = rundir.read_grid(run_dir)
    if cells is None:
        raise RunError(f"run '{run_dir}' has no prediction grid (fitted with --grid none); refit it with a grid")
    table = run_change_table(run_dir, model, cells, t1, t2, level, chunk, hyper_draws)
    return ChangeResult(table, t_from, t_to, units_text(cfg), level, table.attrs.get("hyper", ""))
