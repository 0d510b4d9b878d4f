"""Model families. Importing this package registers every model with :func:`gpcore.make_model`.

One file per family; each registers itself with :func:`gpcore.models.registry.register`. The shared
pieces: ``base.py`` (the model class), ``config.py``, ``registry.py``, ``inputs.py``, ``likelihood.py``,
``recalibration.py``, ``io.py``, ``training.py`` (the optimisation loop) and ``features.py`` (the feature
form the joint posterior builds on). Nothing in this package imports :mod:`gpcore.posterior`,
:mod:`gpcore.distributed` or any other module above it (tests/gpcore/models/test_layering.py).
"""

from gpcore.models import cagp, dbk, dbknn, exact, softki, solvegp, svgp, vecchia  # noqa: F401  (registers them)
from gpcore.models.base import GPModel, Prediction  # noqa: F401
from gpcore.models.config import BaseConfig  # noqa: F401
from gpcore.models.inputs import as_1d_float, as_2d_float, as_groups, as_weights  # noqa: F401
from gpcore.models.io import jsonable, load_model  # noqa: F401
from gpcore.models.registry import DEFAULT_MODEL, available_models, make_model, model_spec  # noqa: F401
