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
