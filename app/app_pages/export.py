"""Export: the prediction grid (GeoTIFF, GeoJSON, CSV), the trained model and the run manifest.

A run with time as an input exports the grid at the quarter slider's quarter (the Maps page's, view state ``at``) and,
between the Change map's two quarters (view state ``change_from``, ``change_to``), the posterior of the change."""

from __future__ import annotations

import json
from functools import partial

import streamlit as st

from app import cache, decide_cache, state, timeview
from app.colors import UNCERTAIN
from app.safe_html import md_text


def render(data, runs: list) -> None:
    """The Export page of the active run (the sidebar's picker)."""
    st.title("Export")
    if not runs:
        st.info("No runs yet: train one on the Train page.")
        return
    info = next((r for r in runs if r.run_id == state.view().run), runs[0])
    st.markdown(f"#### {md_text(cache.run_titles([info])[info.run_id])}")
    path = str(info.path)
    m = info.manifest
    stem = f"{info.run_id}"
    has_grid = cache.has_grid(path)

    st.subheader("Prediction grid")
    quarters = timeview.run_quarters(m)
    quarter = timeview.quarter_slider(quarters) if has_grid else None
    at = f" at {quarter}" if quarter else ""
    st.caption(
        f"The grid{at}. Columns: mean, sd, lower, upper, width in the target's original units and mean_t, sd_t, "
        "width_t in model space. GeoTIFF: one float32 band per column in the grid's own CRS (one pixel per cell)."
    )
    file_downloads(partial(cache.export_grid_bytes, path, quarter=quarter), f"{stem}-{quarter}" if quarter else stem,
                   "{}", {"geotiff": "w_dl_tif", "geojson": "w_dl_geojson", "csv": "w_dl_csv"}, disabled=not has_grid)
    if has_grid and len(quarters) > 1:
        change_downloads(info, quarters, stem)

    st.subheader("Model and manifest")
    c = st.columns(3)
    c[0].download_button("Model (zip: model.json + model.safetensors)", data=lambda: cache.model_zip_bytes(path),
                         file_name=f"{stem}-model.zip", mime="application/zip", on_click="ignore",
                         icon=":material/download:", key="w_dl_model")
    c[1].download_button("Run manifest (run.json)", data=cache.manifest_bytes(path),
                         file_name=f"{stem}-run.json", mime="application/json", on_click="ignore",
                         icon=":material/download:", key="w_dl_manifest")
    st.caption("Load the model with `gpcore.load_model('model/')`; reproduce the run with the CLI command below.")
    cfg = m.get("config", {})
    st.code(cli_command(cfg), language="bash")
    summary = {
        "run_id": m.get("run_id"),
        "created": m.get("created"),
        "config": cfg,
        "seed": cfg.get("seed"),
        "data": {k: v for k, v in m.get("data", {}).items() if k != "report"},
        "device": m.get("device"),
        "versions": m.get("versions"),
    }
    st.json(json.loads(json.dumps(summary)), expanded=1)


def change_downloads(info, quarters: list[str], stem: str) -> None:
    """The change between the Change map's two quarters, per grid cell, for download (computed on request: a run's
    first change fits the hyperparameters' posterior)."""
    st.subheader("Change between two quarters")
    t_from, t_to = timeview.change_controls(quarters)
    if t_from == t_to:
        st.info("Choose two different quarters to export the change between them.")
        return
    st.caption(
        "Per cell: change_mean, change_sd, change_lo, change_hi (95 % interval) and p_increase = P(change > 0), from "
        "the joint posterior of the two quarters, in model units (for a log10 target: log10 of the ratio). The same "
        f"as `python -m gpcore change RUN --from {t_from} --to {t_to}` and the Maps page's Change map."
    )
    if not st.toggle(f"Prepare the change {t_from} → {t_to} for download", value=False, key="w_export_change",
                     help="A run's first change takes two to three minutes at 100,000 rows on a 2-core CPU (the "
                          "hyperparameters' posterior); later ones, and one the Change map already showed, seconds."):
        return
    key = cache.run_key(info)
    table = decide_cache.st_change(*key, t_from, t_to)
    p = table["p_increase"].to_numpy()
    lo, hi = UNCERTAIN
    st.caption(f"{len(table):,} cells: {int((p >= hi).sum()):,} likely improved (P(improved) ≥ {hi:g}), "
               f"{int((p <= lo).sum()):,} likely worse (≤ {lo:g}), the others with an uncertain sign.")
    file_downloads(partial(decide_cache.change_file_bytes, *key, t_from, t_to), f"{stem}-change-{t_from}-{t_to}",
                   "Change ({})", {f: f"w_dl_change_{f}" for f in ("geotiff", "geojson", "csv")})


#: ``format: (button label, file suffix, MIME type)`` of the map downloads
FORMATS = {"geotiff": ("GeoTIFF", "tif", "image/tiff"), "geojson": ("GeoJSON", "geojson", "application/geo+json"),
           "csv": ("CSV", "csv", "text/csv")}


def file_downloads(make, name: str, label: str, keys: dict[str, str], disabled: bool = False) -> None:
    """One download button per format of ``keys`` (``{format: widget key}``) in a row of three: ``make(format)`` gives
    the file's bytes when the button is clicked, ``name`` its file name without suffix, ``label`` the button text
    around the format's name."""
    for col, (fmt, key) in zip(st.columns(3), keys.items(), strict=False):
        text, suffix, mime = FORMATS[fmt]
        col.download_button(label.format(text), data=partial(make, fmt), file_name=f"{name}.{suffix}", mime=mime,
                            disabled=disabled, on_click="ignore", icon=":material/download:", key=key)


def cli_command(cfg: dict) -> str:
    """The ``python -m gpcore fit`` command that reproduces a run's configuration."""
    from gpcore.run.config import fit_command

    return fit_command(cfg, out="runs/reproduced")

