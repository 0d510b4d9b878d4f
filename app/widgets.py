"""Generic widgets: model settings drawn from a config dataclass's field metadata.

A model's ``Config`` fields carry ``metadata`` (``help``, ``choices``, ``min``, ``max``, ``main``);
:func:`settings_form` draws one widget per field, so a newly registered model appears with its
settings and no page changes.
"""

from __future__ import annotations

import math
from dataclasses import Field, fields

import streamlit as st

#: Run-level settings drawn elsewhere on the Train page, never as model settings (``space_time``: with "Time as an
#: input", :mod:`app.train_time`; without t it can only be "none").
RUN_LEVEL = {"seed", "space_time"}


def setting_widget(f: Field, default, key: str, disabled: bool = False):
    """One input widget for a config field; returns its value."""
    meta = f.metadata or {}
    help_ = meta.get("help") or None
    label = f.name.replace("_", " ")
    choices = meta.get("choices")
    if choices:
        options = list(choices)
        index = options.index(default) if default in options else 0
        return st.selectbox(label, options, index=index, key=key, help=help_, disabled=disabled)
    if isinstance(f.default, bool):
        return st.checkbox(label, value=bool(default), key=key, help=help_, disabled=disabled)
    lo, hi = meta.get("min"), meta.get("max")
    if isinstance(f.default, int):
        return int(
            st.number_input(
                label, value=int(default), step=1, key=key, help=help_, disabled=disabled,
                min_value=None if lo is None else int(math.ceil(lo)),
                max_value=None if hi is None else int(hi),
            )
        )
    if isinstance(f.default, float):
        d = float(default)
        # float step for every magnitude: 10 ** 0 is the int 1, and Streamlit refuses a float value with an
        # int step (StreamlitMixedNumericTypesError), which hid the Train button for most models
        step = float(10.0 ** math.floor(math.log10(abs(d)))) if d else 0.1
        return float(
            st.number_input(
                label, value=d, step=step, format="%g", key=key, help=help_, disabled=disabled,
                min_value=None if lo is None else float(lo),
                max_value=None if hi is None else float(hi),
            )
        )
    return st.text_input(label, value=str(default), key=key, help=help_, disabled=disabled)


def settings_form(model_name: str, main: bool, overrides: dict | None = None) -> dict:
    """Widgets for the ``main`` (or the other) settings of a registered model; returns ``{name: value}``.

    Defaults are the paper defaults (the config's field defaults) with the registry preset on top.
    Preset keys with a fixed set of choices define the variant (``basis`` of ``dbk-rbf``) and are
    shown but fixed; preset numbers (``batch_size``...) are editable defaults. Only values that
    differ from these defaults are returned (the preset is applied by ``make_model`` anyway).
    ``overrides`` replaces defaults.
    """
    from gpcore.models import model_spec

    spec = model_spec(model_name)
    out = {}
    chosen = [
        f for f in fields(spec.cls.Config)
        if bool((f.metadata or {}).get("main")) == main and f.name not in RUN_LEVEL
        and f.name not in spec.cls.unused_settings
    ]
    if not chosen:
        return out
    cols = st.columns(3)
    for i, f in enumerate(chosen):
        fixed = f.name in spec.preset and bool((f.metadata or {}).get("choices"))
        base = spec.preset.get(f.name, f.default)
        default = (overrides or {}).get(f.name, base)
        with cols[i % 3]:
            value = setting_widget(f, default, key=f"w_set_{model_name}_{f.name}", disabled=fixed)
        if not fixed and value != base:
            out[f.name] = value
    return out
