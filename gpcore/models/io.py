"""Saving and loading fitted models: ``model.json`` (config, scalers, state) + ``model.safetensors`` (tensors).

No pickle: a saved model is JSON and safetensors only. :func:`load_model` validates ``model.json`` (types,
sizes, finite scalers) before building anything and checks the tensors against the module the config
implies, so a damaged or crafted model raises :class:`~gpcore.errors.InputError`. Tensors whose shapes
depend on the data (inducing points, neighbour sets) are resized on load (:func:`_load_state_resizing`).
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import numpy as np
import torch
from torch import nn

from gpcore.errors import InputError
from gpcore.models.inputs import check_scalers
from gpcore.models.registry import model_spec

FORMAT_VERSION = 1


def save_model(model, path) -> Path:
    """Save a fitted model to a directory: ``model.json`` (config, scalers) + ``model.safetensors`` (tensors)."""
    from safetensors.torch import save

    model._check_fitted()
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    meta = {
        "format": "gpcore-model",
        "format_version": FORMAT_VERSION,
        "model": model.name,
        "registry_name": model.registry_name,
        "config": model.config.to_dict(),
        "d": model.d_,
        "n_train": model.n_train_,
        "x_lo": [float(v) for v in model.x_lo_],
        "x_span": [float(v) for v in model.x_span_],
        "y_mean": model.y_mean_,
        "y_std": model.y_std_,
        "extra": model._extra_state(),
        "weighted": model.weighted,
        "recalibration": getattr(model, "recal_", None),
        "train_info": jsonable(model.train_info_),
        "history": jsonable(model.history_),
    }
    tensors = {k: _compact(v.detach().cpu().contiguous().clone()) for k, v in model.module_.state_dict().items()}
    # bytes written by Python, not save_file: save_file makes the file 0600, so a run store that another user
    # reads (the dashboard serving runs the CLI wrote) could not load it; this follows the umask like model.json
    (path / "model.safetensors").write_bytes(save(tensors))
    (path / "model.json").write_text(json.dumps(meta, indent=2))
    return path


#: settings added after models were first saved, with the value that reproduces a model saved without them
LEGACY_SETTINGS = {"time_trend": False}  # space-time prior mean: constant before the trend existed


def load_model(path, device: str | None = None):
    """Load a model saved by :meth:`GPModel.save`. Reads JSON and safetensors only (no pickle).

    ``model.json`` is validated (types, ``d`` against ``x_lo``/``x_span``, finite scalers) before any
    module is built, and the tensors must be finite and match the module: a damaged or crafted model
    raises :class:`InputError`.
    """
    path = Path(path)
    meta_path = path / "model.json"
    if not meta_path.exists():
        raise InputError(f"'{path}' is not a saved gpcore model (no model.json); pass the directory save() wrote")
    try:
        meta = json.loads(meta_path.read_text())
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise InputError(f"'{meta_path}' is not valid JSON ({e}); the model files are damaged, re-run the fit") \
            from None
    if not isinstance(meta, dict) or meta.get("format") != "gpcore-model":
        raise InputError(f"'{meta_path}' is not a gpcore model file")
    _check_saved_meta(meta, meta_path)
    spec = model_spec(meta["model"])
    known = {f.name for f in dataclasses.fields(spec.cls.Config)}
    cfg = {**{k: v for k, v in LEGACY_SETTINGS.items() if k in known and k not in meta["config"]}, **meta["config"]}
    if device is not None:
        cfg["device"] = device
    model = spec.cls(**cfg)
    model.registry_name = meta.get("registry_name", meta["model"])
    model.d_ = int(meta["d"])
    model.n_train_ = int(meta["n_train"])
    model.x_lo_ = np.asarray(meta["x_lo"], dtype=np.float64)
    model.x_span_ = np.asarray(meta["x_span"], dtype=np.float64)
    model.y_mean_ = float(meta["y_mean"])
    model.y_std_ = float(meta["y_std"])
    model._set_extra_state(meta.get("extra", {}))
    model.train_info_ = meta.get("train_info", {})
    model.recal_ = meta.get("recalibration")
    model.history_ = meta.get("history", [])
    state = _load_tensors(path / "model.safetensors")
    bad = sorted(k for k, v in state.items() if v.is_floating_point() and not bool(torch.isfinite(v).all()))
    if bad:
        raise InputError(f"'{path}': tensor(s) {', '.join(bad[:5])} hold NaN or inf; re-run the fit")
    with torch.device("meta"):  # sizes the config implies, without allocating anything
        probe = model._build(model.d_, None, None)
    implied = sum(v.numel() for v in probe.state_dict().values())
    saved = sum(v.numel() for v in state.values())
    if implied > 2 * saved + 4096:
        raise InputError(
            f"'{path}': model.json implies {implied:,} parameters but model.safetensors holds {saved:,}; "
            "the model files do not belong together, re-run the fit"
        )
    module = model._build(model.d_, None, None).to(device=model.device, dtype=model.dtype)
    model.module_ = module
    if meta.get("weighted", False):  # absent in models saved before weights existed: unweighted
        model._add_nugget()
    _load_state_resizing(module, {k: v.to(model.device) for k, v in state.items()})
    model.module_ = module
    model.module_.eval()
    model.fitted_ = True
    return model


def _load_tensors(file: Path) -> dict[str, torch.Tensor]:
    """The tensors of a ``model.safetensors`` file (InputError when missing or damaged)."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    if not file.is_file():
        raise InputError(f"'{file}' is missing; the model files are incomplete, re-run the fit")
    try:
        return load_file(str(file))
    except (SafetensorError, OSError, ValueError, RuntimeError) as e:
        raise InputError(f"'{file}' is not a readable safetensors file ({e}); re-run the fit") from None


#: Largest input dimension a saved model may declare (spatial models use 2; the guard stops a crafted
#: model.json from allocating gigabytes before its tensors are checked).
MAX_SAVED_D = 4096


def _check_saved_meta(meta: dict, meta_path: Path) -> None:
    """Validate model.json's types and sizes before anything is allocated (InputError naming the field)."""

    def bad(field: str, why: str) -> InputError:
        return InputError(f"'{meta_path}': field '{field}' {why}; the model files are damaged, re-run the fit")

    for key in ("model", "config", "d", "n_train", "x_lo", "x_span", "y_mean", "y_std"):
        if key not in meta:
            raise bad(key, "is missing")
    if not isinstance(meta["model"], str):
        raise bad("model", "is not a model name")
    if not isinstance(meta["config"], dict):
        raise bad("config", "is not an object of settings")
    d = meta["d"]
    if isinstance(d, bool) or not isinstance(d, int) or not 1 <= d <= MAX_SAVED_D:
        raise bad("d", f"= {d!r} is not an input dimension in 1..{MAX_SAVED_D}")
    n = meta["n_train"]
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise bad("n_train", f"= {n!r} is not a positive count")
    for key in ("x_lo", "x_span"):
        v = meta[key]
        if not isinstance(v, list) or len(v) != d or not all(
            isinstance(a, (int, float)) and not isinstance(a, bool) for a in v
        ):
            raise bad(key, f"is not a list of {d} numbers (d = {d})")
    for key in ("y_mean", "y_std"):
        if isinstance(meta[key], bool) or not isinstance(meta[key], (int, float)):
            raise bad(key, "is not a number")
    for key in ("extra", "train_info"):
        if key in meta and not isinstance(meta[key], dict):
            raise bad(key, "is not an object")
    if "history" in meta and not isinstance(meta["history"], list):
        raise bad("history", "is not a list")
    try:
        check_scalers(meta["x_lo"], meta["x_span"], float(meta["y_mean"]), float(meta["y_std"]), str(meta_path))
    except InputError as e:
        raise InputError(f"{e}; the model files are damaged, re-run the fit") from None


def _compact(t: torch.Tensor) -> torch.Tensor:
    """int64 index tensors (``vecchia``'s neighbour sets) saved as the narrowest of int16 / int32 that holds every
    value (a quarter or half of the file); :func:`_load_state_resizing` widens them back to the module's dtype."""
    if t.dtype != torch.int64 or not t.numel():
        return t
    lo, hi = int(t.min()), int(t.max())
    for dt in (torch.int16, torch.int32):
        info = torch.iinfo(dt)
        if info.min <= lo and hi <= info.max:
            return t.to(dt)
    return t


def _load_state_resizing(module: nn.Module, state: dict[str, torch.Tensor]) -> None:
    """``load_state_dict`` that also accepts data-dependent buffer/parameter shapes."""
    own = module.state_dict()
    missing = sorted(set(own) - set(state))
    unexpected = sorted(set(state) - set(own))
    if missing or unexpected:
        raise InputError(f"saved tensors do not match the model: missing {missing}, unexpected {unexpected}")
    narrow = (torch.int16, torch.int32)
    state = {k: v.to(own[k].dtype) if own[k].dtype == torch.int64 and v.dtype in narrow else v
             for k, v in state.items()}
    for key, value in state.items():
        if own[key].shape != value.shape:
            *parents, leaf = key.split(".")
            owner = module
            for p in parents:
                owner = getattr(owner, p)
            current = getattr(owner, leaf)
            if isinstance(current, nn.Parameter):
                setattr(owner, leaf, nn.Parameter(torch.empty_like(value), requires_grad=current.requires_grad))
            else:
                owner.register_buffer(leaf, torch.empty_like(value))
    module.load_state_dict(state, strict=True)


def jsonable(obj):
    """``obj`` with NumPy scalars as Python numbers, keys as strings and NaN/inf as ``None`` (strict JSON)."""
    if isinstance(obj, dict):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [jsonable(v) for v in obj]
    if isinstance(obj, (np.floating, np.integer)):
        return obj.item()
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    return obj
