"""Arrays for a model from a frame read by :func:`read_measurements`.

>>> import numpy as np, pandas as pd
>>> df = pd.DataFrame({"lon": [-66.1, -66.0], "lat": [18.2, 18.3], "mbps": [10.0, 100.0]})
>>> m = model_inputs(df, target="mbps", transform="log10")
>>> m.X.shape, m.y.tolist()
((2, 2), [1.0, 2.0])
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from gpcore.data.transforms import TargetTransform, get_transform
from gpcore.errors import DataError


@dataclass(frozen=True)
class ModelInputs:
    """Inputs ``X`` (n x d: lon, lat[, decimal year]), transformed target ``y`` (n,), weights ``w`` (n,) or None."""

    X: np.ndarray
    y: np.ndarray | None
    w: np.ndarray | None
    transform: TargetTransform
    columns: tuple[str, ...]
    target: str | None


def model_inputs(
    gdf: pd.DataFrame, target: str | None = None, transform=None, weight: str | None = None, use_time: bool = False
) -> ModelInputs:
    """Model arrays from a frame with ``lon``/``lat`` columns (degrees, EPSG:4326).

    Defaults come from ``gdf.attrs`` (``target``, ``transform``, ``weight``) as set by ``read_measurements``.

    Parameters
    ----------
    gdf : DataFrame, n rows
    target : str, optional
        Target column; ``y = transform.forward(gdf[target])``. None gives ``y=None`` (prediction inputs).
    transform : str or TargetTransform, optional
    weight : str, optional
        Per-row weight column.
    use_time : bool
        Append ``time_year`` (decimal years) as a third input column.

    Returns
    -------
    ModelInputs
        ``X`` float64 (n, 2) or (n, 3); ``y`` float64 (n,) in model space; ``w`` float64 (n,).
    """
    attrs = getattr(gdf, "attrs", {}) or {}
    target = target if target is not None else attrs.get("target")
    tr = get_transform(transform if transform is not None else attrs.get("transform"))
    weight = weight if weight is not None else attrs.get("weight")
    cols = ["lon", "lat"] + (["time_year"] if use_time else [])
    missing = [c for c in cols if c not in gdf.columns]
    if missing:
        hint = " (read the file with a time column, e.g. 'quarter')" if "time_year" in missing else ""
        raise DataError(f"the frame has no column(s) {', '.join(missing)}; read it with read_measurements{hint}")
    X = gdf[cols].to_numpy(dtype=float)
    if not np.all(np.isfinite(X)):
        raise DataError("inputs hold NaN or infinite values; read the data with read_measurements(allow_drop=True)")
    y = None
    if target is not None:
        if target not in gdf.columns:
            raise DataError(f"no target column '{target}'")
        raw = pd.to_numeric(gdf[target], errors="coerce").to_numpy(dtype=float)
        bad = ~np.isfinite(raw) | tr.invalid(raw)
        if bad.any():
            raise DataError(
                f"column '{target}': {int(bad.sum())} values are missing, non-finite or invalid under {tr.name}; "
                "read the data with read_measurements(target=..., transform=...) to see and drop them"
            )
        y = tr.forward(raw)
    w = None
    if weight is not None:
        w = pd.to_numeric(gdf[weight], errors="coerce").to_numpy(dtype=float)
        if not np.all(np.isfinite(w)) or np.any(w < 0):
            raise DataError(f"column '{weight}': weights must be finite and >= 0")
    return ModelInputs(X=X, y=y, w=w, transform=tr, columns=tuple(cols), target=target)
