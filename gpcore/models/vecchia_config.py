"""The settings of the Vecchia family (``vecchia``; ``dbk-nn`` extends them): docs/methods/vecchia.md ("Settings")."""

from __future__ import annotations

from dataclasses import dataclass

from gpcore.models import spacetime as st
from gpcore.models import vecchia_cv
from gpcore.models.config import setting
from gpcore.models.kernels import KERNEL_NAMES
from gpcore.models.neighbors import ORDERINGS

__all__ = ["VecchiaConfig"]


@dataclass(frozen=True)
class VecchiaConfig(st.SpaceTimeConfig):
    """Vecchia GP settings. Reference (GPBoost / GpGp practice): Matérn-3/2, m = 30 neighbours, maxmin ordering,
    maximum likelihood. Default: Matérn-1/2 (better test NLL on every data set measured,
    docs/benchmarks/settings.md), m = 30, maxmin, full-batch L-BFGS stopped on the validation NLL, prediction from the
    3m/2 nearest training points (GPBoost: 2m; the joint posterior from m: docs/methods/vecchia.md)."""

    kernel: str = setting("matern12", help="base kernel (Matérn-1/2: measured best on our data sets; GPBoost's "
                                           "default is matern32)", choices=KERNEL_NAMES, main=True)
    neighbors: int = setting(30, help="m: nearest previously-ordered neighbours per training point", min=1, main=True)
    pred_neighbors: int = setting(0, help="nearest training points per prediction (0 = 3/2 x neighbors for marginal "
                                  "predictions; neighbors for the joint posterior)", min=0)
    ordering: str = setting("maxmin", help="training-point ordering", choices=ORDERINGS)
    ard: bool = setting(True, help="one lengthscale per input dimension")
    lengthscale_init: float = setting(0.0, help="initial lengthscale (inputs live in [-1, 1]); 0 = median distance "
                                      "to the m-th nearest neighbour", min=0.0)
    outputscale_init: float = setting(0.0, help="initial outputscale; 0 = the target variance less the initial noise",
                                      min=0.0)
    noise_init: float = setting(0.0, help="initial noise variance (standardised units); 0 = the semivariance of "
                                "nearest neighbours", min=0.0)
    noise_floor: float = setting(1e-6, help="lower bound of the noise variance", min=0.0)
    learn_mean: bool = setting(True, help="learn a constant prior mean")
    chunk_size: int = setting(512, help="points per batched Cholesky (vecchia's predictions and the joint factor on "
                              "the CPU: at most 128, which stay in cache)", min=1)
    optimizer: str = setting("lbfgs", help="'lbfgs' (one L-BFGS iteration with a line search per epoch) or 'adam'",
                             choices=("lbfgs", "adam"), main=True)
    lbfgs_history: int = setting(10, help="L-BFGS curvature pairs kept", min=1)
    lbfgs_tolerance: float = setting(1e-6, help="stop once an L-BFGS iteration changes the training loss by less "
                                     "than this fraction (GPBoost's delta_rel_conv)", min=0.0)
    epochs: int = setting(100, help="full-batch steps (L-BFGS iterations or Adam steps)", min=1, main=True)
    lr: float = setting(0.05, help="Adam learning rate (L-BFGS starts its line search from a unit step)", min=0.0,
                        min_inclusive=False, main=True)
    patience: int = setting(10, help="iterations without a min_improvement gain (raise both for adam)", min=1)
    min_improvement: float = setting(1e-3, help="validation-NLL gain that resets patience; also the kept state's "
                                                "tolerance", min=0.0)
    likelihood_points: int = setting(250_000, help="fit the hyperparameters on the likelihood terms of at most this "
                                     "many training points (a seeded subset, full neighbour sets; 0 = all)", min=0)
    likelihood_fraction: float = setting(1.0, help="fit on this fraction of the training points' terms (at least "
                                         "20,000, at most likelihood_points; 1 = up to likelihood_points)", min=0.0,
                                         max=1.0, min_inclusive=False)
    condition_on_validation: bool = setting(True, help="after training, add the validation rows to the posterior's "
                                            "conditioning set (hyperparameters unchanged, no refit)")
    joint_neighbors: int = setting(15, help="joint posterior (areas, samples, suggestions): nearest earlier new "
                                   "places each new place conditions on, beside its training neighbours", min=0)
    joint_ordering: str = setting("lattice", help="joint posterior: order of the new places (lattice: coarse-to-fine "
                                  "squares; maxmin: exact max-min, slower)", choices=("lattice", "maxmin"))
    cv_calibration: str = setting("none", help="scale the latent variance so that 10-fold cross-validation over the "
                                  "conditioning rows covers 95 %: folds of rows or of cv_block_km squares (lon, lat "
                                  "inputs); a run picks it by its split", choices=vecchia_cv.KINDS)
    cv_block_km: float = setting(10.0, help="cv_calibration='blocks': the squares' side (km)", min=0.0,
                                 min_inclusive=False)
    noise_shape: str = setting("gaussian", help="with cv_calibration: 'gaussian' (the latent scale that covers 95 "
                               "%) or 'two_component' (a skewed noise and the latent scale, by maximum likelihood on "
                               "the cross-validated rows; docs/calibration.md)", choices=vecchia_cv.SHAPES)

    def prediction_chunk(self, device_type: str) -> int:
        """Places per batched step of a prediction or of the joint factor: ``chunk_size``, at most
        ``CPU_PREDICTION_CHUNK`` on the CPU, where groups of 128 places stay in cache (8-12 % faster than 512 over
        48,309 places, the same numbers: docs/benchmarks/decide.md, "Smaller chunks on the CPU")."""
        return max(1, self.chunk_size if device_type != "cpu" else min(self.chunk_size, CPU_PREDICTION_CHUNK))


CPU_PREDICTION_CHUNK = 128
