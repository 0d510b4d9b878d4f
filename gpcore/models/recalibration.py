"""Variance recalibration on the validation split: a split-conformal scale of the predictive variance.

``recalibrate="global"`` fits one scale ``c`` so that ``mean ± z_0.95 sqrt(c var_y)`` covers 95% of the
validation rows (finite-sample conformal quantile); ``"group"`` fits one per stratum (Mondrian
split-conformal), strata with fewer than :data:`MIN_ROWS` validation rows falling back to the global scale.
The state is a small JSON-able dict (``model.recal_``, saved with the model); ``predict`` multiplies
``var_y`` by :func:`variance_scale` and leaves the latent ``var_f`` alone. Method: docs/calibration.md.
"""

from __future__ import annotations

import math
from statistics import NormalDist

import numpy as np

from gpcore.errors import InputError
from gpcore.models.inputs import as_groups

#: fewer validation rows than this in a stratum: that stratum uses the global scale
MIN_ROWS = 20
#: the interval level the recalibrated variances are conformal for
LEVEL = 0.95


def conformal_variance_scale(z: np.ndarray, level: float = 0.95) -> float:
    """Variance scale ``c`` making ``mean ± z_level sqrt(c var_y)`` a split-conformal ``level`` interval.

    ``z = |y - mean| / sd`` on calibration rows; ``q`` is the ``ceil((n + 1) level)``-th smallest
    (the finite-sample conformal quantile; the largest when that exceeds ``n``) and ``c = (q / z_level)^2``.
    """
    z = np.sort(np.asarray(z, dtype=np.float64))
    k = min(int(math.ceil((z.size + 1) * level)), z.size)
    return float((z[k - 1] / NormalDist().inv_cdf(0.5 + level / 2.0)) ** 2)


def fit_recalibration(z: np.ndarray, kind: str, groups=None) -> dict:
    """The recalibration state from validation scores ``z = |y - mean| / sd`` (``(m,)``).

    ``kind``: ``"global"`` (one scale) or ``"group"`` (one per label of ``groups``, ``(m,)``).
    """
    state = {"kind": kind, "level": LEVEL, "global": conformal_variance_scale(z, LEVEL),
             "n": int(z.size), "scales": {}, "counts": {}}
    if kind == "group":
        if groups is None:
            raise InputError("recalibrate='group' needs val_groups: a stratum label per validation row")
        g = as_groups(groups, z.shape[0], "val_groups")
        for label in sorted(set(g.tolist())):
            sel = g == label
            state["counts"][label] = int(sel.sum())
            if sel.sum() >= MIN_ROWS:
                state["scales"][label] = conformal_variance_scale(z[sel], LEVEL)
    return state


def variance_scale(state: dict | None, m: int, groups=None) -> np.ndarray | float:
    """The factor of ``var_y`` for ``m`` rows under ``state`` (1 without recalibration).

    ``"group"``: each row's stratum scale; rows without ``groups``, or of a stratum that had too few
    validation rows or was not in the validation split, get the global scale.
    """
    if not state:
        return 1.0
    if state["kind"] == "global" or groups is None:
        return state["global"]
    g = as_groups(groups, m, "groups")
    return np.array([state["scales"].get(label, state["global"]) for label in g.tolist()], dtype=np.float64)


def joint_mixing(resid_means, v_joint, v_ind, v_noise, grid: int = 101) -> float:
    """The weight ``rho`` in ``[0, 1]`` of a joint posterior's correlated part, fitted on validation blocks.

    For each block, ``resid_means`` is the mean of its rows' residuals ``y - mean``; ``v_joint`` the variance of
    the mean of their latent values under the model's joint posterior (``a^T Sigma a``), ``v_ind`` the same with
    the correlations dropped (``sum a_i^2 Sigma_ii``), ``v_noise`` the noise variance of the mean. ``rho``
    maximises ``sum_B log N(resid_mean_B; 0, rho v_joint + (1 - rho) v_ind + v_noise)`` over a grid. The marginal
    variances are kept; only how they correlate between places moves (docs/decide.md, "DBK's joint calibration").
    """
    r, vj, vi, vn = (np.asarray(a, dtype=np.float64) for a in (resid_means, v_joint, v_ind, v_noise))
    rhos = np.linspace(0.0, 1.0, grid)
    var = rhos[:, None] * vj[None, :] + (1.0 - rhos[:, None]) * vi[None, :] + vn[None, :]
    ll = -0.5 * (np.log(var) + r[None, :] ** 2 / var).sum(1)
    return float(rhos[int(np.argmax(ll))])
