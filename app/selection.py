"""One small adapter for ``st.pydeck_chart`` selections.

Streamlit hands back a typed ``PydeckState`` (attribute access, read-only) from the chart, and
a plain ``dict`` from ``st.session_state[key]`` or JSON; both look like::

    {"selection": {"indices": {"cells": [17]}, "objects": {"cells": [{"id": "...", "p": [lon, lat]}]}}}

:func:`picked` returns the first picked object of a layer (or of any layer) as a plain dict, or
``None`` for an empty or malformed state. No Streamlit import.

>>> picked({"selection": {"indices": {"cells": [3]}, "objects": {"cells": [{"id": "c3", "p": [1.0, 2.0]}]}}})
{'layer': 'cells', 'index': 3, 'object': {'id': 'c3', 'p': [1.0, 2.0]}}
>>> picked(None) is None
True
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def _get(obj: Any, key: str) -> Any:
    if obj is None:
        return None
    if isinstance(obj, Mapping):
        try:
            return obj[key]
        except (KeyError, TypeError):
            return None
    return getattr(obj, key, None)


def picked(state: Any, layer: str | None = None) -> dict | None:
    """``{"layer", "index", "object"}`` of the first selected object (in ``layer`` if given), else None."""
    selection = _get(state, "selection")
    if selection is None and isinstance(state, Mapping) and "objects" in state:
        selection = state  # a bare selection dict
    objects = _get(selection, "objects") or {}
    indices = _get(selection, "indices") or {}
    try:
        layers = [layer] if layer is not None else list(objects.keys())
    except AttributeError:
        return None
    for name in layers:
        objs = _get(objects, name) or []
        if not objs:
            continue
        idx = _get(indices, name) or [None]
        obj = objs[0]
        if not isinstance(obj, Mapping):
            continue
        return {"layer": name, "index": idx[0] if idx else None, "object": dict(obj)}
    return None


def picked_point(state: Any, layer: str | None = None) -> tuple[float, float, str | None] | None:
    """``(lon, lat, cell_id)`` of a picked object that carries ``p: [lon, lat]`` (or lon/lat fields)."""
    hit = picked(state, layer)
    if hit is None:
        return None
    obj = hit["object"]
    pos = obj.get("p")
    try:
        if pos is not None:
            lon, lat = float(pos[0]), float(pos[1])
        else:
            lon, lat = float(obj["lon"]), float(obj["lat"])
    except (KeyError, TypeError, ValueError, IndexError):
        return None
    cell = obj.get("id")
    return lon, lat, None if cell is None else str(cell)
