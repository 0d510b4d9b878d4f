"""Model settings: a frozen, validated dataclass per model (the scikit-learn estimator contract).

:func:`setting` declares a field with its help text and range; :class:`BaseConfig` holds what every model
shares (training loop, device, precision, seed, recalibration). ``from_dict`` coerces strings from the CLI
or the UI to the field's type and rejects unknown keys by naming the allowed ones.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field, fields
from typing import Any

from gpcore.device import DTYPES
from gpcore.errors import ConfigError


def setting(default, *, help: str = "", choices=None, min=None, max=None, main: bool = False, min_inclusive=True):
    """A config field with validation metadata (``choices`` or a ``[min, max]`` range)."""
    meta = {"help": help, "choices": choices, "min": min, "max": max, "main": main, "min_inclusive": min_inclusive}
    return field(default=default, metadata=meta)


@dataclass(frozen=True)
class BaseConfig:
    """Settings shared by every model (training loop, device, precision, seed)."""

    epochs: int = setting(200, help="maximum number of passes over the training data", min=1, main=True)
    batch_size: int = setting(1024, help="mini-batch size (ignored by full-batch objectives)", min=1, main=True)
    lr: float = setting(1e-3, help="Adam(W) learning rate", min=0.0, min_inclusive=False, main=True)
    weight_decay: float = setting(0.0, help="AdamW weight decay on backbone weights only", min=0.0)
    patience: int = setting(20, help="epochs without validation-NLL improvement before stopping", min=1)
    min_improvement: float = setting(0.0, help="nats per point the validation NLL must fall within patience epochs; "
                                               "above 0 a later state within this or two paired SEs of the lowest "
                                               "validation NLL is kept", min=0.0)
    max_seconds: float = setting(0.0, help="wall-clock budget for training in seconds (0 = none)", min=0.0)
    device: str = setting("auto", help="'auto' picks CUDA when available, else CPU", choices=("auto", "cpu", "cuda"))
    dtype: str = setting("float32", help="precision of networks and n-sized tensors", choices=tuple(DTYPES))
    seed: int = setting(0, help="random seed (initialisation and batch order)", min=0)
    predict_batch_size: int = setting(16384, help="points per prediction batch (bounds memory)", min=1)
    recalibrate: str = setting(
        "none", help="scale predictive variances on the validation split: 'none', 'global' or 'group' (per stratum)",
        choices=("none", "global", "group"))

    @classmethod
    def field_names(cls) -> list[str]:
        return [f.name for f in fields(cls)]

    @classmethod
    def from_dict(cls, settings: dict[str, Any]) -> BaseConfig:
        """Build and validate a config; unknown keys raise :class:`ConfigError` naming the allowed ones."""
        allowed = cls.field_names()
        unknown = [k for k in settings if k not in allowed]
        if unknown:
            raise ConfigError(
                f"unknown setting(s) {', '.join(map(repr, unknown))} for {cls.__name__}; "
                f"allowed: {', '.join(allowed)}"
            )
        coerced = {}
        for f in fields(cls):
            if f.name in settings:
                coerced[f.name] = _coerce(f, settings[f.name], cls.__name__)
        cfg = cls(**coerced)
        cfg.validate()
        return cfg

    def validate(self) -> None:
        for f in fields(self):
            v = getattr(self, f.name)
            meta = f.metadata
            if meta.get("choices") is not None and v not in meta["choices"]:
                raise ConfigError(
                    f"setting {f.name}={v!r} is not allowed; allowed values: {', '.join(map(repr, meta['choices']))}"
                )
            lo, hi = meta.get("min"), meta.get("max")
            if isinstance(v, float) and not math.isfinite(v):
                raise ConfigError(f"setting {f.name}={v!r} is not a finite number; give a number such as {f.default!r}")
            if lo is not None and (v < lo or (v == lo and not meta.get("min_inclusive", True))):
                op = ">=" if meta.get("min_inclusive", True) else ">"
                raise ConfigError(f"setting {f.name}={v!r} is out of range; it must be {op} {lo}")
            if hi is not None and v > hi:
                raise ConfigError(f"setting {f.name}={v!r} is out of range; it must be <= {hi}")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def replace(self, **changes) -> BaseConfig:
        return type(self).from_dict({**self.to_dict(), **changes})


def _coerce(f: dataclasses.Field, value, cls_name: str):
    """Coerce strings from the CLI / UI to the field's type, with a clear error."""
    default = f.default
    try:
        if isinstance(default, bool):
            if isinstance(value, str):
                if value.lower() in ("1", "true", "yes", "on"):
                    return True
                if value.lower() in ("0", "false", "no", "off"):
                    return False
                raise ValueError(value)
            return bool(value)
        if isinstance(default, int):
            if isinstance(value, float) and not value.is_integer():
                raise ValueError(value)
            return int(value)
        if isinstance(default, float):
            return float(value)
        if isinstance(default, str):
            return str(value)
    except (TypeError, ValueError):
        raise ConfigError(
            f"setting {f.name}={value!r} of {cls_name} must be of type {type(default).__name__}"
        ) from None
    return value
