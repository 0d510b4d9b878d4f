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
    feature check dropped the DBK features is its nearest-neighbour residual GP alone; a vecchia / dbk-nn run's
    intervals carry a cross-validated latent scale (docs/calibration.md)."""
    info = manifest.get("train_info") or {}
    notes = [n for n in (_feature_note(manifest), calibration_note(info)) if n]
    return " ".join([notes[0], *(n[0].upper() + n[1:] for n in notes[1:])]) if notes else ""


def calibration_note(train_info: dict | None) -> str:
    """``"the latent variance is scaled by 0.72 ..."``: the cross-validated latent scale of a run's ``train_info``
    (``""`` without one, or when nothing could be held out: :func:`gpcore.models.vecchia_cv.applied`)."""
    from gpcore.metrics import WEIGHT_BINS
    from gpcore.models.vecchia_cv import applied, recorded_count_scales, recorded_shape

    cv = applied(train_info)
    if cv is None:
        return ""
    folds = f"{cv.get('block_km', 10):g} km blocks of " if cv.get("folds") == "blocks" else ""
    before, after = cv.get("coverage_before"), cv.get("coverage_after")
    cover = (f" (as fitted the 95 % intervals covered {100 * before:.1f} % of the held-out rows, scaled "
             f"{100 * after:.1f} %)" if isinstance(before, (int, float)) and isinstance(after, (int, float)) else "")
    shape = recorded_shape(train_info)
    skew = ""
    if shape is not None and shape.pi > 0:
        side = "above" if shape.offset >= 0 else "below"
        other = "below" if side == "above" else "above"
        own = "almost no noise of their own" if shape.c2 < 0.05 else f"{shape.c2:.2g}× the noise variance"
        skew = (f"; a new measurement's noise is skewed: {100 * shape.pi:.0f} % of measurements lie about "
                f"{abs(shape.offset):.2g} noise SDs {side} the map with {own}, the rest about "
                f"{abs(shape.first_offset()):.2g} {other} it with {shape.c1:.2g}×")
    scales = recorded_count_scales(train_info)
    counts = ""
    if scales is not None:
        bins = " / ".join(b[0] for b in WEIGHT_BINS)
        counts = (f"; the noise variance is scaled per tests count ({bins}: "
                  f"{' / '.join(f'{q:.2f}' for q in scales)}×) so that each count's held-out rows are covered 95 %")
    ref = " (docs/calibration.md)" if skew or counts else ""
    return (f"the latent variance is scaled by {cv['scale']:.3g}, from {cv.get('k', 10)}-fold cross-validation over "
            f"{folds}the {cv.get('rows', 0):,} rows the model conditions on{cover}{skew}{counts}{ref}.")


def _feature_note(manifest: dict) -> str:
    check = (manifest.get("train_info") or {}).get("feature_check")
    if not isinstance(check, dict) or check.get("kept", True):
        return ""
    r, w = check.get("residual_only", float("nan")), check.get("with_features", float("nan"))
    screen = check.get("screen") if isinstance(check.get("screen"), dict) else {}
    both = f"({r:.4f} without them, {w:.4f} with them"
    if check.get("hybrid_fitted") is not False:
        why = f"they did not lower the validation NLL by more than the fit's threshold {both})"
    elif screen.get("gain_se") is not None and screen.get("a", 0) > 0:  # the screen's gate (dbknn_screen.py)
        k = ((manifest.get("config") or {}).get("settings") or {}).get("screen_se", 1.0)
        why = (f"at the residual GP's fitted covariance shape they lowered the validation NLL by {r - w:.4f}, not more "
               f"than {k:g} standard error(s) of the validation rows ({screen['gain_se']:.4f}) {both})")
    elif screen.get("a") == 0:  # the screen's best scale of the features was 0: only the residual's scale moved
        why = (f"at the residual GP's fitted covariance shape the best weight of the features was 0 ({r:.4f} without "
               f"them, {w:.4f} with the residual GP rescaled)")
    else:  # a run from before the gate
        why = (f"they did not lower the validation NLL by more than the fit's threshold {both} at the residual GP's "
               "fitted covariance shape)")
    return f"the DBK features were dropped: {why}, so this run is a nearest-neighbour (Vecchia) GP."


def noise_text(manifest: dict, t_units: str) -> str:
    """``"noise sd 0.35 log10(Mbps)"`` from a run manifest's learned noise variance."""
    var = manifest.get("noise_variance")
    if var is None or not math.isfinite(var) or var < 0:
        return ""
    return f"learned noise sd {math.sqrt(var):.3g} {t_units}".strip()
