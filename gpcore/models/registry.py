"""The model registry: a name (``"dbk"``, ``"svgp"``, presets such as ``"dbk-rbf"``) maps to a class and settings.

Each family registers itself with :func:`register` (and presets with :func:`register_alias`) when its
module is imported; ``gpcore/models/__init__.py`` imports every family, so the registry is complete once
the package is imported.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpcore.errors import ConfigError


@dataclass(frozen=True)
class ModelSpec:
    name: str
    cls: type
    preset: dict
    description: str


_REGISTRY: dict[str, ModelSpec] = {}

#: The model a new user gets (the Train page's first choice, ``python -m gpcore fit`` without ``--model``): the
#: winner of the fair race against GPBoost on four data sets, random and block splits (docs/benchmarks/race.md).
DEFAULT_MODEL = "dbk-nn"


def register(name: str, description: str = "", **preset):
    """Class decorator registering a model under ``name`` (more names via :func:`register_alias`)."""

    def deco(cls):
        cls.name = name
        _REGISTRY[name] = ModelSpec(name, cls, dict(preset), description or (cls.__doc__ or "").strip().split("\n")[0])
        return cls

    return deco


def register_alias(name: str, base: str, description: str, **preset) -> None:
    """Register ``name`` as ``base`` with some settings preset (e.g. ``dbk-rbf`` = ``dbk`` with basis=rbf)."""
    spec = _REGISTRY[base]
    _REGISTRY[name] = ModelSpec(name, spec.cls, {**spec.preset, **preset}, description)


def available_models() -> list[str]:
    """Names accepted by :func:`make_model` (families and presets such as ``dbk-rbf``)."""
    return sorted(_REGISTRY)


def model_spec(name: str) -> ModelSpec:
    try:
        return _REGISTRY[name]
    except KeyError:
        raise ConfigError(f"unknown model {name!r}; available: {', '.join(sorted(_REGISTRY))}") from None


def make_model(name: str, **settings):
    """Create an unfitted model (a :class:`~gpcore.models.base.GPModel`) by registry name; settings override the
    preset of that name."""
    spec = model_spec(name)
    model = spec.cls(**{**spec.preset, **settings})
    model.registry_name = name
    return model
