"""gpcore — scalable Gaussian-process regression for spatial data, behind one interface.

>>> from gpcore import make_model, available_models
>>> "dbk" in available_models()
True
"""

from gpcore.device import describe_device, resolve_device
from gpcore.errors import ConfigError, DataError, GPCoreError, InputError
from gpcore.models import Prediction, available_models, load_model, make_model, model_spec

__version__ = "0.1.0"

__all__ = [
    "ConfigError",
    "DataError",
    "GPCoreError",
    "InputError",
    "Prediction",
    "available_models",
    "describe_device",
    "load_model",
    "make_model",
    "model_spec",
    "resolve_device",
]
