"""Peer implementations the benchmarks compare against (one definition, shared by every bench_*.py)."""

from __future__ import annotations


def gpytorch_svgp(Z):
    """GPyTorch's standard SVGP with ``Z`` (``m x d``) as learnable inducing points.

    Whitened ``VariationalStrategy``, Cholesky variational distribution, constant mean and a
    scaled ARD RBF kernel; returns ``(model, likelihood)`` on ``Z``'s device.
    """
    import gpytorch

    class SVGP(gpytorch.models.ApproximateGP):
        def __init__(self):
            dist = gpytorch.variational.CholeskyVariationalDistribution(Z.shape[0])
            super().__init__(gpytorch.variational.VariationalStrategy(self, Z, dist, learn_inducing_locations=True))
            self.mean_module = gpytorch.means.ConstantMean()
            self.covar_module = gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel(ard_num_dims=Z.shape[1]))

        def forward(self, x):
            return gpytorch.distributions.MultivariateNormal(self.mean_module(x), self.covar_module(x))

    return SVGP().to(Z.device), gpytorch.likelihoods.GaussianLikelihood().to(Z.device)


class GPyTorchSVGPEpochs:
    """GPyTorch SVGP on prepared tensors (VariationalELBO, Adam), trained one timed epoch per call.

    ``X`` (``n x d``) and ``y`` (``n``) are the scaled inputs and standardised targets on the device the
    peer should run on, ``Z`` its initial inducing points; ``generator`` (CPU) orders the batches
    (default: the global RNG).
    """

    def __init__(self, X, y, Z, batch: int, lr: float = 1e-2, generator=None):
        import gpytorch
        import torch

        self.X, self.y, self.batch, self.generator = X, y, batch, generator
        self.model, self.lik = gpytorch_svgp(Z)
        self.mll = gpytorch.mlls.VariationalELBO(self.lik, self.model, num_data=len(y))
        self.opt = torch.optim.Adam([*self.model.parameters(), *self.lik.parameters()], lr=lr)
        self.model.train()
        self.lik.train()

    def _sync(self):
        import torch

        if self.X.device.type == "cuda":
            torch.cuda.synchronize(self.X.device)

    def epoch(self) -> float:
        """One pass over the data in random batches; returns its wall-clock seconds."""
        import time

        import torch

        self._sync()
        t0 = time.perf_counter()
        perm = torch.randperm(len(self.y), generator=self.generator).to(self.X.device)
        for idx in torch.split(perm, self.batch):
            self.opt.zero_grad(set_to_none=True)
            loss = -self.mll(self.model(self.X[idx]), self.y[idx])
            loss.backward()
            self.opt.step()
        self._sync()
        return time.perf_counter() - t0


#: GPBoost's Vecchia GP as issue 13 runs it: Matérn-3/2, 30 neighbours, package defaults otherwise
GPBOOST_VECCHIA = {"cov_function": "matern", "cov_fct_shape": 1.5, "likelihood": "gaussian", "gp_approx": "vecchia",
                   "num_neighbors": 30}


def gpboost_available() -> bool:
    """Whether the optional peer GPBoost (``pip install gpboost``; never a gpcore dependency) is importable."""
    try:
        import gpboost  # noqa: F401
    except ImportError:
        return False
    return True


def gpboost_vecchia(X, y, X_pred, weights=None, weights_pred=None, shape: float | None = None) -> dict:
    """Fit GPBoost's Vecchia GP (:data:`GPBOOST_VECCHIA`, a constant fixed effect) on ``X`` (``n x d``, used as
    given: no scaling), ``y`` (``n``) and predict at ``X_pred``. ``shape``: the Matérn smoothness instead of
    the reference 1.5 (0.5 = exponential, 2.5).

    ``weights`` (``n``, > 0): GPBoost's own per-observation weights, which divide the error variance of
    observation ``i`` by ``weights[i]`` (no nugget floor, unlike gpcore's ``tau^2 + sigma^2 / w``); ``var_y``
    of a prediction row is then its latent variance plus ``Error_var / weights_pred[i]`` (one measurement
    when ``weights_pred`` is None). Unweighted, ``var_y`` is GPBoost's response variance (latent + Error_var).

    Returns ``{"mean", "var_y", "fit_seconds", "predict_seconds", "cov_pars"}``.
    """
    import time

    import gpboost as gpb
    import numpy as np

    X, y, X_pred = (np.asarray(a, dtype=np.float64) for a in (X, y, X_pred))
    kw = {} if weights is None else {"weights": np.asarray(weights, dtype=np.float64)}
    t0 = time.perf_counter()
    settings = dict(GPBOOST_VECCHIA) if shape is None else {**GPBOOST_VECCHIA, "cov_fct_shape": float(shape)}
    gp = gpb.GPModel(gp_coords=X, **settings, **kw)
    gp.fit(y=y, X=np.ones((len(y), 1)))
    fit_s = time.perf_counter() - t0
    cov = gp.get_cov_pars()
    t0 = time.perf_counter()
    q = gp.predict(gp_coords_pred=X_pred, X_pred=np.ones((len(X_pred), 1)), predict_var=True,
                   predict_response=weights is None)
    mean, var = np.asarray(q["mu"], dtype=np.float64), np.asarray(q["var"], dtype=np.float64)
    if weights is not None:
        w = np.ones(len(X_pred)) if weights_pred is None else np.asarray(weights_pred, dtype=np.float64)
        var = var + float(cov["Error_var"].iloc[0]) / w
    return {"mean": mean, "var_y": var, "fit_seconds": fit_s, "predict_seconds": time.perf_counter() - t0,
            "cov_pars": {k: float(cov[k].iloc[0]) for k in cov.columns}}
