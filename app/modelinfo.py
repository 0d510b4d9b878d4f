"""What to say next to a PI map: how each method's uncertainty behaves (docs/app.md; each method: docs/methods/).

A model class may carry its own ``uncertainty_note`` (a ClassVar string); otherwise the note is
looked up here by registry family, and finally the registry description is shown. New models
therefore need no page change. No Streamlit here.
"""

from __future__ import annotations

import math

NOTES = {
    "dbk": "DBK (dPPGP) learns input-dependent variance: intervals widen where the data are sparse or noisy.",
    "svgp": "SVGP-type models tend to nearly constant, noise-dominated interval widths.",
    "softki": (
        "SoftKI does not revert to the prior far from the data and can be overconfident with a small fixed noise."
    ),
    "cagp": "CaGP adds computational uncertainty: its intervals are wider than the exact GP's.",
    "solvegp": "SOLVE-GP behaves like SVGP with more inducing points.",
    "exact": "The exact GP is the reference posterior (small data only).",
}


def uncertainty_note(model_name: str) -> str:
    """One sentence on the uncertainty semantics of a registered model (``""`` if unknown)."""
    from gpcore.errors import ConfigError
    from gpcore.models import model_spec

    try:
        spec = model_spec(model_name)
    except ConfigError:
        return ""
    note = getattr(spec.cls, "uncertainty_note", None)
    if isinstance(note, str) and note:
        return note
    family = getattr(spec.cls, "name", model_name)
    return NOTES.get(family, spec.description)


def training_note(manifest: dict) -> str:
    """What training decided that changes how to read the run's maps (``""`` if nothing): a dbk-nn run whose
    feature check dropped the DBK features is its nearest-neighbour residual GP alone."""
    check = (manifest.get("train_info") or {}).get("feature_check")
    if not isinstance(check, dict) or check.get("kept", True):
        return ""
    # hybrid_fitted False: the screen saw no gain at the residual's shape and skipped the hybrid (dbknn_screen.py)
    where = " at the residual GP's fitted covariance shape" if check.get("hybrid_fitted") is False else ""
    return (
        "the DBK features were dropped: they did not lower the validation NLL by more than the fit's threshold "
        f"({check.get('residual_only', float('nan')):.4f} without them, {check.get('with_features', float('nan')):.4f} "
        f"with them{where}), so this run is a nearest-neighbour (Vecchia) GP."
    )


def noise_text(manifest: dict, t_units: str) -> str:
    """``"noise sd 0.35 log10(Mbps)"`` from a run manifest's learned noise variance."""
    var = manifest.get("noise_variance")
    if var is None or not math.isfinite(var) or var < 0:
        return ""
    return f"learned noise sd {math.sqrt(var):.3g} {t_units}".strip()
