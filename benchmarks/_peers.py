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
