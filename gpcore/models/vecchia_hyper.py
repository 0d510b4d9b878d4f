"""The kernel hyperparameters' posterior of a fitted ``vecchia`` (or ``dbk-nn`` whose feature check dropped its
features): restricted maximum likelihood (REML) and its Laplace approximation, and models at draws from it.

Why: a change between two quarters, ``P(f(x, t2) > f(x, t1))``, computed at one set of fitted hyperparameters is
over- or under-confident by however far those are from the truth in this data set; averaging it over the
hyperparameters' posterior calibrates it (docs/methods/spacetime.md, "Hyperparameter uncertainty";
docs/benchmarks/spacetime.md, "What does calibrate the change").

The prior mean is ``H(x) beta`` with the design ``H = (1)``, or ``(1, t)`` (``t`` the scaled time column) with a time
trend; ``beta`` = ``(mu0[, trend])``. With the Vecchia precision ``Q = U^T U`` (row ``i`` of ``U`` the Vecchia row
``ell_i`` of point ``i``: ``u_i(z) = ell_i . z_{N(i), i}``, ``ell_ii = 1 / sqrt(d_i)``) the REML objective of the
kernel hyperparameters ``theta`` (mean integrated out under a flat prior) is, up to a constant,

    R(theta) = - sum_i log ell_ii + 1/2 (c - b^T A^{-1} b) + 1/2 log det A,
    A = sum_i u_i(H) u_i(H)^T,   b = sum_i u_i(H) u_i(y),   c = sum_i u_i(y)^2,

and the generalised-least-squares mean ``beta_hat = A^{-1} b``. At ``m = n - 1`` this is the exact GP's REML. Its
gradient comes chunk by chunk (memory of one chunk) in two passes: the first sums ``A, b, c`` without a graph, the
second differentiates ``- sum log ell_ii + 1/2 sum (u_i(y) - u_i(H)^T beta_hat)^2 + 1/2 sum u_i(H)^T A^{-1} u_i(H)``
with ``beta_hat`` and ``A^{-1}`` held fixed, whose gradient is ``R``'s (the first two terms by the envelope theorem,
the last because ``d log det A = tr(A^{-1} dA)``).

``theta`` is the log of each positive hyperparameter (each spatial lengthscale, the time lengthscale, the
outputscale, the noise above its floor) and Gneiting's ``logit beta``; under a flat prior on ``theta`` the posterior
is approximated by ``N(theta_hat, H^{-1})`` at the REML mode, ``H`` the Hessian of ``R`` by forward differences of
the gradient, its eigenvalues floored at :data:`EIGEN_FLOOR`. Above ``likelihood_points`` rows the terms of the
fit's seeded subset, scaled (:mod:`gpcore.models.terms`).
"""

from __future__ import annotations

import copy
import hashlib
import math
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import torch
from scipy.optimize import minimize

from gpcore.errors import InputError
from gpcore.models import spacetime as st
from gpcore.models.linalg import inv_softplus
from gpcore.models.terms import Terms, objective_rows, term_count

#: floor of the Hessian's eigenvalues (a flat direction gets a wide but finite spread)
EIGEN_FLOOR = 1e-2
#: forward-difference step of the Hessian, in theta (log) units
HESSIAN_STEP = 1e-4
#: buffers a working copy shares with the fitted model (never written by it)
_SHARED = ("X_train", "y_train", "order", "nbr", "w_train")


def supports(model) -> bool:
    """Whether ``model`` has this hyperparameter posterior: a fitted Vecchia GP, or a ``dbk-nn`` without features."""
    from gpcore.models.vecchia import VecchiaGP

    return (isinstance(model, VecchiaGP) and getattr(model, "module_", None) is not None
            and not getattr(model, "features_used", False))


def _hyper_params(mod) -> list[tuple[str, torch.nn.Parameter, str]]:
    """``(name, parameter, transform)`` of the kernel hyperparameters: ``log`` (theta = log softplus(raw)) or
    ``logit`` (theta = raw)."""
    out = [("raw_ell", mod.raw_ell, "log")]
    if mod.space_time != "none":
        out.append(("raw_ell_t", mod.raw_ell_t, "log"))
        if mod.space_time == "gneiting":
            out.append(("raw_beta", mod.raw_beta, "logit"))
    return out + [("raw_outputscale", mod.raw_outputscale, "log"), ("raw_noise", mod.raw_noise, "log")]


def names(model) -> list[str]:
    """The entries of ``theta`` in order (``raw_ell[0]``, ...)."""
    out = []
    for name, p, _ in _hyper_params(model.module_):
        out += [f"{name}[{j}]" for j in range(p.numel())] if p.dim() else [name]
    return out


def get_theta(model) -> np.ndarray:
    """``theta`` of the model's current hyperparameters."""
    out = []
    for _, p, kind in _hyper_params(model.module_):
        raw = p.detach().double().reshape(-1)
        out.append(raw if kind == "logit" else torch.log(torch.nn.functional.softplus(raw)))
    return torch.cat(out).cpu().numpy()


def _set_theta(model, theta: np.ndarray) -> None:
    th = torch.as_tensor(np.asarray(theta, dtype=np.float64))
    i = 0
    with torch.no_grad():
        for _, p, kind in _hyper_params(model.module_):
            k = p.numel()
            v = th[i : i + k]
            if kind == "log":  # raw = softplus^-1(e^theta)
                v = torch.tensor([inv_softplus(math.exp(float(x))) for x in v], dtype=torch.float64)
            p.copy_(v.reshape(p.shape).to(p.dtype))
            i += k


def _theta_grad(model) -> np.ndarray:
    """d R / d theta from the raw parameters' ``.grad`` (chain rule of the transforms)."""
    out = []
    for _, p, kind in _hyper_params(model.module_):
        g = p.grad.detach().double().reshape(-1) if p.grad is not None else torch.zeros(p.numel(), dtype=torch.float64)
        if kind == "log":
            raw = p.detach().double().reshape(-1)
            g = g * torch.nn.functional.softplus(raw) / torch.sigmoid(raw)  # d raw / d theta = v / sigmoid(raw)
        out.append(g)
    return torch.cat(out).cpu().numpy()


def working_copy(model):
    """A shallow copy of ``model`` with its own module (hyperparameters and mean in float64) that shares the training
    data and the neighbour index, so that setting hyperparameters on it leaves ``model`` as it is (several app
    sessions may share one model)."""
    if not supports(model):
        raise InputError(f"{type(model).__name__} has no REML hyperparameter posterior (vecchia, or dbk-nn without "
                         "features)")
    mod = model.module_
    memo = {id(getattr(mod, b)): getattr(mod, b) for b in _SHARED}
    model._neighbor_tree()  # built once on the model and shared: it depends on the inputs only, not on theta
    clone = copy.copy(model)
    clone.module_ = copy.deepcopy(mod, memo)
    own = [q for _, q, _ in _hyper_params(clone.module_)] + [clone.module_.mu0, getattr(clone.module_, "trend", None)]
    for p in own:  # the hyperparameters and the mean in float64 (a feature network keeps its dtype)
        if p is not None:
            p.data = p.data.double()
    for p in clone.module_.parameters():
        p.grad = None
    clone._joint_cache = None
    clone.train_info_ = dict(getattr(model, "train_info_", {}) or {})
    return clone


def _terms(model) -> Terms:
    n, cfg = model.module_.X_train.shape[0], model.config
    k = term_count(n, cfg.likelihood_points, cfg.likelihood_fraction)
    return Terms(n, objective_rows(n, k, cfg.seed, model.module_.X_train.device))


def _rows(model, idx: torch.Tensor):
    """``(log ell_ii, u(y), u(H))`` of ordered rows ``idx`` (with a graph when grad is on)."""
    from gpcore.models.vecchia import vecchia_rows

    mod = model.module_
    G = torch.cat([mod.nbr[idx], idx[:, None]], dim=1)
    valid = G >= 0
    Gc = G.clamp_min(0)
    Xg = mod.X_train[Gc]
    zero = torch.zeros((), dtype=torch.float64, device=G.device)
    yg = torch.where(valid, mod.y_train.double()[Gc], zero)
    Hg = torch.where(valid.unsqueeze(-1), st.mean_design(mod, Xg), zero)
    ell = vecchia_rows(mod, Xg, valid, model._group_noise(Gc))
    return torch.log(ell[:, -1]), (ell * yg).sum(-1), (ell.unsqueeze(-1) * Hg).sum(-2)


def _sums(model, terms: Terms):
    """``(A, b, c, sum log ell_ii)`` over the objective's terms (no graph), scaled to all ``n``."""
    mod = model.module_
    p = st.mean_design(mod, mod.X_train[:1]).shape[-1]
    dev = mod.X_train.device
    A = torch.zeros(p, p, dtype=torch.float64, device=dev)
    b = torch.zeros(p, dtype=torch.float64, device=dev)
    c = torch.zeros((), dtype=torch.float64, device=dev)
    sld = torch.zeros((), dtype=torch.float64, device=dev)
    with torch.no_grad():
        for idx, _ in terms.chunks(model.config.chunk_size, dev, own=False):
            ld, uy, uH = _rows(model, idx)
            A += uH.T @ uH
            b += uH.T @ uy
            c += uy.pow(2).sum()
            sld += ld.sum()
    return tuple(terms.weigh(v) for v in (A, b, c, sld))


def reml(model, grad: bool = True) -> tuple[float, np.ndarray | None, np.ndarray]:
    """``(R, dR/dtheta, beta_hat)`` at ``model``'s current hyperparameters (a :func:`working_copy`: ``grad`` writes
    its parameters' ``.grad``). ``R`` is the module docstring's, per the whole data set, plus ``(n - p)/2 log 2 pi``."""
    mod, terms = model.module_, _terms(model)
    A, b, c, sld = _sums(model, terms)
    p = A.shape[0]
    LA = torch.linalg.cholesky(A) if p else A
    beta = torch.cholesky_solve(b[:, None], LA).squeeze(-1) if p else b
    value = (-sld + 0.5 * (c - b @ beta) + (torch.log(torch.diagonal(LA)).sum() if p else 0.0)
             + 0.5 * (terms.n - p) * math.log(2 * math.pi))
    if not grad:
        return float(value), None, beta.cpu().numpy()
    Ainv = torch.cholesky_inverse(LA) if p else A
    for q in mod.parameters():
        q.grad = None
    for idx, _ in terms.chunks(model.config.chunk_size, mod.X_train.device, own=False):
        ld, uy, uH = _rows(model, idx)
        r = uy - uH @ beta
        loss = -ld.sum() + 0.5 * r.pow(2).sum() + 0.5 * ((uH @ Ainv) * uH).sum()
        terms.weigh(loss).backward()
    return float(value), _theta_grad(model), beta.cpu().numpy()


@dataclass
class HyperPosterior:
    """The Laplace approximation ``N(mode, cov)`` of the hyperparameters ``theta`` (:func:`names`) at the REML mode,
    the GLS mean there and how the mode was found."""

    names: list[str]
    mode: np.ndarray
    cov: np.ndarray
    beta: np.ndarray
    value: float
    iterations: int
    converged: bool

    def draws(self, k: int, seed: int = 0) -> np.ndarray:
        """``k`` draws of ``theta`` (``k x len(mode)``), seeded."""
        L = np.linalg.cholesky(self.cov)
        return self.mode + np.random.default_rng(seed).standard_normal((k, len(self.mode))) @ L.T


def _key(model) -> tuple:
    """What the posterior depends on: the conditioning rows and every parameter's value."""
    mod = model.module_
    digest = hashlib.sha1()
    for p in mod.parameters():
        digest.update(p.detach().cpu().numpy().tobytes())
    return tuple(mod.X_train.shape), digest.hexdigest()


#: the ``format`` of :func:`to_record`'s dict (a run keeps it as JSON: gpcore.run.change.run_change_table)
RECORD_FORMAT = "gpcore-hyper-posterior-1"


def to_record(model, post: HyperPosterior) -> dict:
    """``post`` as a JSON-ready dict, with what it was computed from (:func:`_key`: the conditioning rows' shape and
    a digest of every parameter), so that :func:`from_record` gives it back only to the same fitted model."""
    shape, digest = _key(model)
    return {"format": RECORD_FORMAT, "rows": list(shape), "params_sha1": digest, "names": list(post.names),
            "mode": [float(v) for v in post.mode], "cov": [[float(v) for v in row] for row in post.cov],
            "beta": [float(v) for v in post.beta], "value": float(post.value), "iterations": int(post.iterations),
            "converged": bool(post.converged)}


def from_record(model, record) -> HyperPosterior | None:
    """The posterior of :func:`to_record` when ``record`` is one, well formed (finite, the model's hyperparameters,
    a symmetric covariance) and computed from ``model`` as it is now (same rows and parameters); else ``None``."""
    try:
        if not isinstance(record, dict) or record.get("format") != RECORD_FORMAT:
            return None
        shape, digest = _key(model)
        if record.get("rows") != list(shape) or record.get("params_sha1") != digest:
            return None
        k = len(names(model))
        mode, cov = np.asarray(record["mode"], dtype=np.float64), np.asarray(record["cov"], dtype=np.float64)
        beta = np.asarray(record["beta"], dtype=np.float64)
        p = st.mean_design(model.module_, model.module_.X_train[:1]).shape[-1]
        if (record.get("names") != names(model) or mode.shape != (k,) or cov.shape != (k, k) or beta.shape != (p,)
                or not all(np.isfinite(a).all() for a in (mode, cov, beta)) or not np.array_equal(cov, cov.T)
                or not isinstance(record.get("iterations"), int) or not isinstance(record.get("converged"), bool)):
            return None
        return HyperPosterior(names(model), mode, cov, beta, float(record["value"]), record["iterations"],
                              record["converged"])
    except (KeyError, TypeError, ValueError):
        return None


def remember(model, post: HyperPosterior) -> None:
    """Keep ``post`` on ``model`` as :func:`hyper_posterior` would (a stored one, given back by :func:`from_record`)."""
    model._hyper_cache = (_key(model), post)


def cached(model) -> HyperPosterior | None:
    """The posterior :func:`hyper_posterior` keeps on ``model``, if it is still ``model``'s; else ``None``."""
    kept = getattr(model, "_hyper_cache", None)
    return kept[1] if kept is not None and kept[0] == _key(model) else None


def hyper_posterior(model, max_iter: int = 100) -> HyperPosterior:
    """The REML mode from ``model``'s fitted hyperparameters (L-BFGS over ``theta``) and the Laplace approximation
    there (module docstring); ``model`` itself is not changed. Kept on the model until its parameters or its
    conditioning rows change (a second change between other quarters reuses it)."""
    kept = cached(model)
    if kept is not None:
        return kept
    post = _hyper_posterior(model, max_iter)
    remember(model, post)
    return post


def _hyper_posterior(model, max_iter: int) -> HyperPosterior:
    work = working_copy(model)

    def f(theta):
        _set_theta(work, theta)
        value, g, _ = reml(work)
        return value, g

    res = minimize(f, get_theta(work), jac=True, method="L-BFGS-B", options={"maxiter": max_iter, "gtol": 1e-6})
    mode = np.asarray(res.x, dtype=np.float64)
    H = hessian(work, mode, np.asarray(res.jac, dtype=np.float64))
    w, V = np.linalg.eigh(H)
    cov = (V / np.maximum(w, EIGEN_FLOOR)) @ V.T
    _set_theta(work, mode)
    value, _, beta = reml(work, grad=False)
    return HyperPosterior(names(model), mode, 0.5 * (cov + cov.T), beta, value, int(res.nit), bool(res.success))


def hessian(work, theta: np.ndarray, grad: np.ndarray | None = None, step: float = HESSIAN_STEP) -> np.ndarray:
    """The Hessian of ``R`` at ``theta`` by forward differences of its gradient (``grad``: the gradient at
    ``theta`` when known), symmetrised (``work``: a :func:`working_copy`, left at ``theta``). One gradient per
    hyperparameter: at a mode of a smooth ``R`` the first-order error (``step`` times the third derivatives) is far
    below the Hessian's own scale."""
    k = len(theta)
    if grad is None:
        _set_theta(work, theta)
        grad = reml(work)[1]
    H = np.empty((k, k))
    for j in range(k):
        e = np.zeros(k)
        e[j] = step
        _set_theta(work, theta + e)
        H[:, j] = (reml(work)[1] - grad) / step
    _set_theta(work, theta)
    return 0.5 * (H + H.T)


def at_theta(model, theta: np.ndarray):
    """A :func:`working_copy` of ``model`` with hyperparameters ``theta`` and its GLS mean there: a model to
    predict with (its posterior refreshed: ``dbk-nn``'s residuals follow the new mean)."""
    work = working_copy(model)
    _set_theta(work, theta)
    st.set_mean(work.module_, reml(work, grad=False)[2])
    for p in work.module_.parameters():
        p.grad = None
    work._after_conditioning(0)  # dbk-nn: e = y - mean with the new mean; vecchia: nothing depends on it
    return work


def draws(model, k: int, seed: int = 0, posterior: HyperPosterior | None = None) -> Iterator:
    """``k`` models at seeded draws from the hyperparameters' posterior (:func:`at_theta`), one at a time."""
    post = posterior or hyper_posterior(model)
    for theta in post.draws(k, seed):
        yield at_theta(model, theta)
