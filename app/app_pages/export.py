"""Export: the prediction grid (GeoTIFF, GeoJSON, CSV), the trained model and the run manifest."""

from __future__ import annotations

import json

import streamlit as st

from app import cache, state
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
    st.caption(
        "Columns: mean, sd, lower, upper, width in the target's original units and mean_t, sd_t, width_t in "
        "model space. GeoTIFF: one float32 band per column in the grid's own CRS (one pixel per cell)."
    )
    c = st.columns(3)
    c[0].download_button("GeoTIFF", data=lambda: cache.export_grid_bytes(path, "geotiff"), file_name=f"{stem}.tif",
                         mime="image/tiff", disabled=not has_grid, on_click="ignore", icon=":material/download:",
                         key="w_dl_tif")
    c[1].download_button("GeoJSON", data=lambda: cache.export_grid_bytes(path, "geojson"),
                         file_name=f"{stem}.geojson", mime="application/geo+json", disabled=not has_grid,
                         on_click="ignore", icon=":material/download:", key="w_dl_geojson")
    c[2].download_button("CSV", data=lambda: cache.export_grid_bytes(path, "csv"), file_name=f"{stem}.csv",
                         mime="text/csv", disabled=not has_grid, on_click="ignore", icon=":material/download:",
                         key="w_dl_csv")

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


def cli_command(cfg: dict) -> str:
    """The ``python -m gpcore fit`` command that reproduces a run's configuration."""
    from gpcore.run.config import fit_command

    return fit_command(cfg, out="runs/reproduced")

