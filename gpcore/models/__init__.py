"""Model families. Importing this package registers every model with :func:`gpcore.make_model`.

One file per family; each registers itself with :func:`gpcore.models.base.register`.
Families whose optional pieces fail to import are skipped with a warning instead of breaking
the registry.
"""

from gpcore.models import dbk, exact  # noqa: F401
from gpcore.models.base import (  # noqa: F401
    BaseConfig,
    GPModel,
    Prediction,
    as_1d_float,
    as_2d_float,
    as_groups,
    as_weights,
    available_models,
    load_model,
    make_model,
    model_spec,
)
from gpcore.models.base import _jsonable as jsonable  # noqa: F401

# Families added by later work register themselves here, one import per file.
for _name in ("svgp", "softki", "cagp", "solvegp", "vecchia", "dbknn"):
    try:
        __import__(f"gpcore.models.{_name}")
    except ModuleNotFoundError as _e:  # file not present yet
        if _e.name != f"gpcore.models.{_name}":
            raise
