"""The joint posterior of the Vecchia family (``vecchia``, ``dbk-nn``) at many new places (docs/decide.md,
"Joint posterior of vecchia and dbk-nn").

Response-first joint Vecchia prediction (Katzfuss, Guinness, Gong & Zilber 2020; GPBoost's
``vecchia_pred_type="order_obs_first_cond_all"``): the new places are put in a coarse-to-fine order (the config's
``joint_ordering``: the lattice ordering, or max-min) *after* the training points, and each conditions on its
``m_t`` nearest training targets (noisy) and its ``m_p`` nearest *earlier new places* (latent). With ``g = f - mu0``
at the new places and ``e`` the training targets' residuals,

    g_j = b_j^T e_T(j) + c_j^T g_P(j) + sqrt(d_j) xi_j,      xi ~ N(0, I),

where ``(b_j, c_j, d_j)`` are the kriging weights and the conditional variance of the exact GP on the group
``[y_T(j), f_P(j), f_j]`` (one ``(m_t + m_p + 1)``-square Cholesky per place, batched). In matrix form
``U g = B e + D^{1/2} xi`` with ``U = I - C`` unit lower triangular and sparse (``m_p`` entries per row), so

    E[g] = U^{-1} B e,      Cov[g] = U^{-1} D U^{-T},

and ``D^{-1/2} U`` is the sparse inverse Cholesky factor of the joint precision. Joint samples cost one sparse
triangular solve per sample, the variance of a weighted sum ``w^T g`` is ``|D^{1/2} U^{-T} w|^2`` (one transposed
solve per area), and nothing ``n x n`` is formed. With ``m_t = n_train`` and ``m_p = n - 1`` every factor
conditions on all its predecessors and the result is the exact GP posterior (the tests check it in float64).

``dbk-nn`` (``f = mu0 + a phi^T w + r``): given ``w`` the residual ``r`` is the above with
``e(w) = y - mu0 - a Phi_T w``, and ``w ~ N(w_hat, F F^T)`` (its exact posterior given the Vecchia residual) is
independent of ``xi``. Hence

    f - E[f] = Q (w - w_hat) + U^{-1} D^{1/2} xi,      Q = a Phi_P - U^{-1} B a Phi_T,
    Cov[f] = Q F F^T Q^T + U^{-1} D U^{-T}:

the low-rank part enters exactly, carried through the places' own features and through the neighbours'
residuals (the joint form of the marginal variance in docs/methods/dbknn.md).
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace

import numpy as np
import scipy.sparse as sp
import torch
from scipy.sparse.linalg import spsolve_triangular

from gpcore.models.linalg import kriging_weights, psd_safe_cholesky

__all__ = ["VecchiaJoint", "build_joint"]

@dataclass
class VecchiaJoint:
    """The joint Gaussian of ``f`` at ``n`` new places (standardised units, float64, numpy).

    ``order[i]`` is the place that comes ``i``-th in the prediction ordering; ``U`` (``n x n`` CSR, unit lower
    triangular) and ``d`` (``(n,)``) are in that ordering; ``mean`` (``(n,)``, ``f``'s mean including ``mu0``) is in
    the caller's order. A low-rank part (``dbk-nn``) is ``F`` (``p x q``) with ``Phi`` (``n x p``, ``a Phi_P``, caller
    order) and ``BPhi`` (``n x p``, ``B a Phi_T``, ordering space); ``Q = Phi - U^{-1} BPhi`` (caller order) is solved
    for only when samples or a dense covariance need it: an areal variance uses ``W^T Q = W^T Phi - (U^{-T} W)^T
    BPhi``, which reuses the transposed solve of the Vecchia part instead of ``p`` more solves.
    """

    order: np.ndarray
    U: sp.csr_matrix
    d: np.ndarray
    mean: np.ndarray
    F: np.ndarray | None = None
    Phi: np.ndarray | None = None
    BPhi: np.ndarray | None = None
    T: np.ndarray | None = None  # with a low-rank part: each place's training neighbours (n x m_t, ordering space)
    Bt: np.ndarray | None = None  # ... and their kriging weights b_j (BPhi = sum_k Bt[:, k] a Phi_T[T[:, k]])

    @property
    def n(self) -> int:
        return int(self.mean.shape[0])

    @property
    def Q(self) -> np.ndarray | None:
        """``Q = a Phi_P - U^{-1} B a Phi_T`` (``n x p``, caller order; ``None`` without a low-rank part), solved
        once and kept."""
        if self.F is None:
            return None
        if getattr(self, "_Q", None) is None:
            self._Q = self.Phi - self._to_caller(self._solve(self.BPhi))
        return self._Q

    def _solve(self, R: np.ndarray) -> np.ndarray:
        """``U^{-1} R`` (``n x s``, ordering space)."""
        return spsolve_triangular(self.U, R, lower=True, unit_diagonal=True)

    def _solve_t(self, R: np.ndarray) -> np.ndarray:
        """``U^{-T} R`` (``n x s``, ordering space). ``U^T`` with its rows and columns reversed is lower triangular,
        and scipy solves that about twice as fast as the upper ``U^T`` (0.2 s against 0.35 s for 78 areas over
        48,309 places: docs/benchmarks/decide.md, "The lattice ordering, adopted"); kept once built."""
        if getattr(self, "_Ut_rev", None) is None:
            rev = np.arange(self.n - 1, -1, -1)
            self._Ut_rev = self.U.T.tocsr()[rev][:, rev].tocsr()
        rev = slice(None, None, -1)
        return spsolve_triangular(self._Ut_rev, R[rev], lower=True, unit_diagonal=True)[rev]

    def _to_caller(self, A: np.ndarray) -> np.ndarray:
        out = np.empty_like(A)
        out[self.order] = A
        return out

    def cov(self) -> np.ndarray:
        """The dense ``n x n`` covariance (caller order): for small sets."""
        Li = self._solve(np.diag(np.sqrt(self.d)))  # U^{-1} D^{1/2}, ordering space
        Li = self._to_caller(Li)
        C = Li @ Li.T
        if self.Q is not None:
            QF = self.Q @ self.F
            C = C + QF @ QF.T
        return C

    def linear(self, W: sp.spmatrix | np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Mean and variance of ``W^T f`` for the columns of ``W`` (``n x G``, caller order)."""
        W = sp.csr_matrix(W)
        mean = W.T @ self.mean
        Wo = W[self.order].toarray()
        Z = self._solve_t(Wo)  # U^{-T} W
        var = (Z * Z * self.d[:, None]).sum(0)
        if self.F is not None:
            WQ = np.asarray(W.T @ self.Phi) - Z.T @ self.BPhi  # W^T Q without solving for Q
            V = self.F.T @ WQ.T  # q x G
            var = var + (V**2).sum(0)
        return np.asarray(mean).ravel(), np.maximum(var, 0.0)

    def deviations(self, xi: np.ndarray, eta: np.ndarray | None = None) -> np.ndarray:
        """``f - E[f]`` for standard normal draws ``xi`` (``n x s``) and ``eta`` (``q x s``); ``n x s``, caller
        order."""
        G = self._to_caller(self._solve(np.sqrt(self.d)[:, None] * xi))
        if self.Q is not None and eta is not None:
            G = G + self.Q @ (self.F @ eta)
        return G

    def sample(self, n_samples: int, seed: int = 0) -> np.ndarray:
        """``n_samples x n`` joint samples of ``f`` (standardised units), seeded."""
        rng = np.random.default_rng(int(seed))
        xi = rng.standard_normal((self.n, n_samples))
        eta = None if self.F is None else rng.standard_normal((self.F.shape[1], n_samples))
        return (self.mean[:, None] + self.deviations(xi, eta)).T

    def lowrank(self, D: int, seed: int = 0) -> np.ndarray:
        """``G`` (``n x (D + q)``) with ``E[G G^T] = Cov``: the Vecchia part by ``D`` Monte-Carlo columns
        ``U^{-1} D^{1/2} xi / sqrt(D)``, the low-rank part exactly (``Q F``). For greedy design (suggestions)."""
        rng = np.random.default_rng(int(seed) + 7919)
        G = self.deviations(rng.standard_normal((self.n, D))) / np.sqrt(D)  # the Vecchia part only (no eta)
        if self.Q is not None:
            G = np.concatenate([G, self.Q @ self.F], 1)
        return G

    # ---------------------------------------------------------------- persistence (a run keeps its grid's factor)
    def tensors(self) -> dict[str, torch.Tensor]:
        """The factor as named CPU tensors for a safetensors file: ``order``, ``U``'s CSR parts (``U_indptr``,
        ``U_indices``, ``U_data``), ``d``, ``mean``, and with a low-rank part the training neighbours ``T`` and their
        weights ``Bt`` (``n x m_t``; :meth:`with_lowrank` rebuilds ``Phi``, ``BPhi`` and ``F`` from the model).
        :meth:`from_tensors` reads them back, checked."""
        U = self.U.tocsr(copy=True)
        U.sort_indices()
        arrays = {"order": np.asarray(self.order, dtype=np.int64), "U_indptr": U.indptr.astype(np.int64),
                  "U_indices": U.indices.astype(np.int64), "U_data": U.data.astype(np.float64),
                  "d": np.asarray(self.d, dtype=np.float64), "mean": np.asarray(self.mean, dtype=np.float64)}
        if self.F is not None:  # the n x p features are the model's: only the training weights are stored
            arrays.update(T=np.asarray(self.T, dtype=np.int64), Bt=np.asarray(self.Bt, dtype=np.float64))
        return {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in arrays.items()}

    def reindexed(self, perm: np.ndarray) -> VecchiaJoint:
        """The same joint posterior with the places in another caller order: new place ``r`` is old place
        ``perm[r]`` (``perm`` a permutation)."""
        perm = np.asarray(perm, dtype=np.int64)
        inv = np.empty_like(perm)
        inv[perm] = np.arange(perm.shape[0])
        out = VecchiaJoint(inv[self.order], self.U, self.d, self.mean[perm], T=self.T, Bt=self.Bt)
        if self.F is not None:
            out.F, out.Phi, out.BPhi = self.F, self.Phi[perm], self.BPhi
        return out

    @classmethod
    def from_tensors(cls, tensors: dict, n: int) -> VecchiaJoint:
        """The factor of :meth:`tensors` for ``n`` places, checked before use: ``ValueError`` saying what is wrong
        (a missing or extra entry, a dtype or shape, ``order`` not a permutation, ``U`` not unit lower triangular
        with sorted rows, a non-finite value, a negative variance)."""
        need = {"order", "U_indptr", "U_indices", "U_data", "d", "mean"}
        low = {"T", "Bt"}
        keys = set(tensors)
        if not need <= keys or keys - need - low or (keys & low and not low <= keys):
            raise ValueError(f"entries {sorted(keys)}; expected {sorted(need)}, plus {sorted(low)} with a low-rank "
                             "part")
        a = {k: v.detach().cpu().numpy() for k, v in tensors.items()}
        for k, v in a.items():
            want = np.int64 if k in ("order", "U_indptr", "U_indices", "T") else np.float64
            if v.dtype != want:
                raise ValueError(f"'{k}' is {v.dtype}, expected {np.dtype(want)}")
            if v.dtype == np.float64 and not np.isfinite(v).all():
                raise ValueError(f"'{k}' holds non-finite values")
        order, indptr, indices, data = a["order"], a["U_indptr"], a["U_indices"], a["U_data"]
        for k, shape in (("order", (n,)), ("U_indptr", (n + 1,)), ("d", (n,)), ("mean", (n,))):
            if a[k].shape != shape:
                raise ValueError(f"'{k}' has shape {a[k].shape}, expected {shape} for {n} places")
        if n and (order.min() < 0 or order.max() >= n or np.bincount(order, minlength=n).max() != 1):
            raise ValueError("'order' is not a permutation of the places")
        nnz = indices.shape[0]
        if indices.ndim != 1 or data.shape != (nnz,) or indptr[0] != 0 or indptr[-1] != nnz \
                or (np.diff(indptr) < 1).any():
            raise ValueError("'U_indptr', 'U_indices', 'U_data' are not the CSR parts of an n x n matrix with a "
                             "diagonal entry in every row")
        rows = np.repeat(np.arange(n), np.diff(indptr))
        last = indptr[1:] - 1  # the diagonal: the last entry of each sorted row
        same = rows[1:] == rows[:-1]
        if (indices < 0).any() or (indices > rows).any() or (np.diff(indices)[same] <= 0).any() \
                or (indices[last] != np.arange(n)).any() or (data[last] != 1.0).any():
            raise ValueError("'U' is not unit lower triangular with sorted rows")
        if (a["d"] < 0).any():
            raise ValueError("'d' holds negative conditional variances")
        U = sp.csr_matrix((data, indices, indptr), shape=(n, n))
        joint = cls(order, U, a["d"], a["mean"])
        if "T" in a:
            T, Bt = a["T"], a["Bt"]
            if T.ndim != 2 or T.shape[0] != n or Bt.shape != T.shape or (n and T.min() < 0):
                raise ValueError(f"low-rank training neighbours T {T.shape} / weights Bt {Bt.shape} do not fit {n} "
                                 "places")
            joint.T, joint.Bt = T, Bt  # completed by with_lowrank
        return joint

    def with_lowrank(self, lowrank, Xs: torch.Tensor) -> VecchiaJoint:
        """A copy of a stored factor with its low-rank part completed from its model: ``lowrank`` is ``(a Phi_T,
        x -> a phi(x), w_hat, F)`` of ``model._joint_lowrank()``, ``Xs`` the places (caller order). ``ValueError``
        when the stored part and the model's disagree (one has a low-rank part and the other not, or neighbours
        beyond the training rows)."""
        if (lowrank is None) != (self.T is None):
            raise ValueError("the stored factor and the model disagree on the low-rank part (features on or off)")
        if lowrank is None:
            return self
        aPhi_T, phi_p, _, F = lowrank
        if self.T.size and self.T.max() >= aPhi_T.shape[0]:
            raise ValueError(f"training neighbours beyond the model's {aPhi_T.shape[0]} training rows")
        return replace(self, BPhi=_weighted_rows(self.T, self.Bt, aPhi_T),
                       Phi=phi_p(Xs).double().cpu().numpy(), F=F.double().cpu().numpy())


def _weighted_rows(T: np.ndarray, Bt: np.ndarray, aPhi_T: torch.Tensor) -> np.ndarray:
    """``B a Phi_T``: row ``j`` is ``sum_k Bt[j, k] aPhi_T[T[j, k]]`` (``n x p``), by one sparse product on the CPU
    instead of an ``n x m_t x p`` gather per chunk (0.45 s less for 48,309 places)."""
    n, m = T.shape
    S = sp.csr_matrix((Bt.ravel(), T.ravel(), np.arange(0, n * m + 1, m)), shape=(n, aPhi_T.shape[0]))
    return np.asarray(S @ aPhi_T.double().cpu().numpy())


class _EarlierPlaces:
    """The ``m`` nearest earlier places of every place of an ordering (``n x m``, ``-1`` pad:
    :func:`gpcore.models.neighbors.ordered_neighbors`). With the KD-tree (a model on the CPU) they are searched on a
    thread of their own, block by block, and :meth:`rows` waits only for the rows it asks for, so the groups' loop
    starts on the first rows while the later ones are searched; with the grid search (an accelerator) at once."""

    def __init__(self, Xo: np.ndarray, m: int, device):
        from gpcore.models.neighbors import ordered_neighbors, use_grid

        self._device, self._cv, self._error = device, threading.Condition(), None
        if use_grid(device):
            self._out, self._done = ordered_neighbors(Xo, m, device=device), len(Xo)
            return
        self._out, self._done = None, -1  # nothing published yet

        def search():
            try:
                self._publish(ordered_neighbors(Xo, m, on_rows=self._publish), len(Xo))
            except BaseException as err:  # raised again in the caller's thread by rows()
                with self._cv:
                    self._error = err
                    self._cv.notify_all()

        threading.Thread(target=search, daemon=True).start()

    def _publish(self, out, k: int) -> None:
        with self._cv:
            self._out, self._done = out, k
            self._cv.notify_all()

    def rows(self, i: int, j: int) -> torch.Tensor:
        """Rows ``i .. j - 1`` (a tensor on the places' device), once they are final."""
        with self._cv:
            self._cv.wait_for(lambda: self._done >= j or self._error is not None)
            if self._error is not None:
                raise self._error
            out = self._out
        return torch.as_tensor(out[i:j], device=self._device)


def _features(phi_p, Xs: torch.Tensor) -> np.ndarray:
    with torch.no_grad():  # grad mode is per thread
        return phi_p(Xs).double().cpu().numpy()


@torch.no_grad()
def build_joint(model, Xs: torch.Tensor, covariance, m_pred: int | None = None) -> VecchiaJoint:
    """The :class:`VecchiaJoint` of a fitted ``vecchia`` / ``dbk-nn`` model at scaled inputs ``Xs`` (``n x d``).

    Training neighbours: the model's ``pred_neighbors`` if set, else its ``neighbors`` (``m``; marginal predictions
    take ``3m/2`` by default: docs/methods/vecchia.md, "Prediction"); earlier new
    places: ``m_pred`` (default the config's ``joint_neighbors``). Cost ``O(n (m_t + m_p)^3)`` for the groups plus
    the orderings and neighbour searches (``O(n log n)``). ``covariance(module, Xg, valid, noise)`` is the
    model's batched group covariance (:func:`gpcore.models.vecchia.group_covariance`). On the CPU the groups go in
    chunks of :meth:`~gpcore.models.vecchia_config.VecchiaConfig.prediction_chunk`, and two parts that need nothing
    from them run on threads beside them: the search for the earlier places (the loop waits only for its chunk's
    rows) and ``dbk-nn``'s features of the places (docs/decide.md, "A run keeps its grid's factor").
    """
    from gpcore.models.neighbors import lattice_order, maxmin_order
    from gpcore.models.spacetime import metric_coords, prior_mean  # space-time: docs/methods/spacetime.md
    from gpcore.models.vecchia_cv import latent_scale

    mod = model.module_
    cfg = model.config
    n = Xs.shape[0]
    m_p = cfg.joint_neighbors if m_pred is None else int(m_pred)
    Xn = metric_coords(mod, Xs)  # the scaled inputs of a spatial model
    order = (lattice_order if cfg.joint_ordering == "lattice" else maxmin_order)(Xn)
    Xo = Xs.detach()[torch.as_tensor(order, device=Xs.device)]
    mp = min(m_p, max(n - 1, 0))
    near = _EarlierPlaces(Xn[order], mp, Xs.device)  # n x m_p (-1 pad), searched beside the loop below on the CPU
    NT = model._prediction_neighbors(Xo, joint=True)  # n x m_t, indices into the ordered training points
    m_t = NT.shape[1]
    e = model._joint_residuals()  # training residuals e (ordered training points), float64
    lowrank = model._joint_lowrank()  # (a Phi_T, a Phi_P-function, w_hat, F) or None
    X_tr = mod.X_train
    cs = cfg.prediction_chunk(Xs.device.type)
    phi_job = None
    if lowrank is not None and Xs.device.type == "cpu":  # a Phi at the new places needs nothing from the loop below:
        pool = ThreadPoolExecutor(max_workers=1)  # computed beside it, on another core (as the KD-tree queries use all
        phi_job = pool.submit(_features, lowrank[1], Xs)  # cores); the thread ends with the job
        pool.shutdown(wait=False)
    n_tr = X_tr.shape[0]
    X_all = torch.cat([X_tr.double(), Xo.double()])  # training inputs, then the new places in their ordering
    c = torch.empty(n, dtype=torch.float64, device=Xs.device)
    d = torch.empty(n, dtype=torch.float64, device=Xs.device)
    BP = torch.empty(n, mp, dtype=torch.float64, device=Xs.device)
    Bt = None if lowrank is None else torch.empty(n, m_t, dtype=torch.float64, device=Xs.device)  # kept for storing
    zero = torch.zeros((), dtype=torch.float64, device=Xs.device)
    for i in range(0, n, cs):
        T = NT[i : i + cs]
        b = T.shape[0]
        P = near.rows(i, i + b)
        own = torch.arange(n_tr + i, n_tr + i + b, device=Xs.device)[:, None]
        Xg = X_all[torch.cat([T, P.clamp_min(0) + n_tr, own], dim=1)]  # b x (m_t + m_p + 1) x d, one gather
        # rows i >= m_p have m_p earlier places each: no padding (valid=None skips the masks), known without a sync
        valid = None if i >= mp else torch.cat([torch.ones_like(T, dtype=torch.bool), P >= 0,
                                                torch.ones(b, 1, dtype=torch.bool, device=Xs.device)], dim=1)
        noise_t = model._group_noise(T)
        if noise_t is None:
            noise_t = mod.noise.double().expand(T.shape)
        noise = torch.cat([noise_t.double(), torch.zeros(b, mp + 1, dtype=torch.float64, device=Xs.device)], dim=1)

        L = psd_safe_cholesky(covariance(mod, Xg, valid, noise))
        w = kriging_weights(L)  # on [T, P]
        if valid is not None:
            w = torch.where(valid[:, :-1], w, zero)
        bt, bp = w[:, :m_t], w[:, m_t:]
        c[i : i + b] = (bt * e[T]).sum(-1)
        BP[i : i + b] = bp
        d[i : i + b] = L[:, -1, -1].pow(2)
        if Bt is not None:
            Bt[i : i + b] = bt
    rows = np.repeat(np.arange(n), mp)
    cols = near.rows(0, n).cpu().numpy().ravel()
    vals = -BP.cpu().numpy().ravel()
    keep = cols >= 0
    U = sp.csr_matrix((np.concatenate([vals[keep], np.ones(n)]),
                       (np.concatenate([rows[keep], np.arange(n)]), np.concatenate([cols[keep], np.arange(n)]))),
                      shape=(n, n))
    U.sum_duplicates()
    joint = VecchiaJoint(order, U, d.cpu().numpy() * latent_scale(model), np.zeros(n))  # cv_calibration's scale
    g = joint._to_caller(joint._solve(c.cpu().numpy()[:, None]))[:, 0]
    mean = prior_mean(mod, Xs).detach().cpu().numpy() + g  # mu0 (+ b t with a time trend)
    if lowrank is not None:
        _, phi_p, w_hat, F = lowrank
        Phi_P = _features(phi_p, Xs) if phi_job is None else phi_job.result()  # a Phi at the new places, caller order
        joint.T, joint.Bt = NT.cpu().numpy(), Bt.cpu().numpy()
        joint.Phi, joint.F = Phi_P, F.cpu().numpy()  # Q on demand (VecchiaJoint.Q)
        joint.BPhi = _weighted_rows(joint.T, joint.Bt, lowrank[0])
        mean = mean + Phi_P @ w_hat.cpu().numpy()
    joint.mean = mean
    return joint
