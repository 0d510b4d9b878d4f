"""A map selection renders the kernel slice of the right cell; a short training run lands in the store."""

from __future__ import annotations

import json
import time

import numpy as np
import pandas as pd
import pytest
from streamlit.testing.v1 import AppTest  # noqa: F401

from app import layers as L
from tests.app.conftest import click_grid, gridmaps, open_page, wait_for_job

RUN = "20240101-000000-000-dbk-rbf"


def test_map_selection_renders_the_kernel_slice_of_that_cell(app, store):
    from gpcore.models import load_model

    app.query_params["run"] = RUN
    app.run()
    open_page(app, "maps").run()
    assert not app.exception
    assert app.session_state["ua_run"] == RUN
    assert any("Click a grid cell" in i.value for i in app.info)
    grid = pd.read_parquet(store / RUN / "grid.parquet")
    i = len(grid) // 2
    cell = grid.iloc[i]
    lon, lat = round(float(cell.lon), 5), round(float(cell.lat), 5)
    click_grid(app, f"pick_{RUN}", i, float(cell.lon), float(cell.lat))
    assert not app.exception, [e.value for e in app.exception]
    assert app.session_state["ua_xref"] == (lon, lat)
    assert any(f"cell `{int(cell.cell_id)}`" in m.value for m in app.markdown)
    # the slice map is drawn around x_ref: its marker sits on the picked cell
    maps = gridmaps(app)
    assert maps[f"pick_{RUN}"]["clickable"] and maps[f"pick_{RUN}"]["lookup"], "the main map takes clicks"
    slices = [a for k, a in maps.items() if k.startswith("slice_")]
    assert len(slices) == 1 and not slices[0]["clickable"], "one kernel-slice map beside the main map"
    assert slices[0]["marker"] == pytest.approx([lon, lat]), "its marker sits on the picked cell"
    # both maps fit their first view, in the browser at their real width, to the region: every cell inside
    for a in (maps[f"pick_{RUN}"], slices[0]):
        W, S, E, N = a["fit"]["bounds"]
        assert a["fit"]["pad"] == L.VIEW_PAD
        assert W <= grid.lon.min() and grid.lon.max() <= E and S <= grid.lat.min() and grid.lat.max() <= N
    # the point's posterior mean and 95 % interval are the model's, back-transformed to Mbps
    model = load_model(store / RUN / "model")
    pred = model.predict(np.array([[lon, lat]]))
    lo, hi = pred.interval(0.95)
    metrics = {m.label: m.value for m in app.metric}
    from app.colors import format_number

    assert metrics["Posterior mean at x_ref"] == f"{format_number(10 ** pred.mean[0])} Mbps"
    assert metrics["95% interval"] == f"[{format_number(10 ** lo[0])}, {format_number(10 ** hi[0])}] Mbps"
    # the selection survives switching maps and recolouring (it lives in the session and the URL)
    app.segmented_control(key="w_map_kind").set_value("width").run()
    app.selectbox(key="w_scale").set_value("magma").run()
    assert app.session_state["ua_xref"] == (lon, lat)
    assert app.query_params["xref"] == f"{lon:.5f},{lat:.5f}"
    assert any(f"cell `{int(cell.cell_id)}`" in m.value for m in app.markdown)
    # strata outlines (the bundled metro / non-metro counties) overlay both maps
    app.checkbox(key="w_strata_outline").check().run()
    assert not app.exception
    outlines = [o for a in gridmaps(app).values() for o in a["outlines"]]
    assert len(outlines) == 2 * 3, "region + metro + non-metro outlines on both maps"


def test_correlation_slice_is_one_at_the_reference(store):
    """The dashboard's correlation normalisation: k(x_ref, x_ref) / k(x_ref, x_ref) = 1 at the picked cell."""
    from app.cache import KernelCache
    from gpcore.models import load_model

    model = load_model(store / RUN / "model")
    grid = pd.read_parquet(store / RUN / "grid.parquet")
    Xg = grid[["lon", "lat"]].to_numpy()
    kc = KernelCache(model.kernel_slicer(Xg), Xg, model)
    i = len(grid) // 4
    corr = kc.slice(Xg[i], "correlation")
    assert corr[i] == pytest.approx(1.0, abs=1e-5)
    assert np.nanmax(np.abs(corr)) <= 1.0 + 1e-5
    k = kc.slice(Xg[i], "kernel")
    np.testing.assert_allclose(k, model.kernel(Xg, Xg[i : i + 1])[:, 0], rtol=1e-4, atol=1e-8)
    assert np.nanmax(np.abs(kc.slice(Xg[i], "max"))) == pytest.approx(1.0)


def test_a_short_training_run_completes_and_lands_in_the_store(app, store):
    from gpcore.run.store import RunStore

    before = {r.run_id for r in RunStore().list()}
    app.run()
    open_page(app, "train").run()
    assert not app.exception
    from gpcore.models import DEFAULT_MODEL

    assert app.selectbox(key="w_model").value == DEFAULT_MODEL, "the race's winner is the page's first choice"
    app.selectbox(key="w_model").select("dbk-rbf").run()
    for name, value in (("epochs", 3), ("rank", 8), ("hidden", 8), ("batch_size", 2048)):
        app.number_input(key=f"w_set_dbk-rbf_{name}").set_value(value)
    app.number_input(key="w_cell_km").set_value(4.0)
    app.button(key="w_train").click().run()
    assert not app.exception, [e.value for e in app.exception]
    job = app.session_state["ua_job"]
    saw_progress = False
    deadline = time.time() + 150
    while not job.done and time.time() < deadline:
        saw_progress |= bool(app.get("progress"))
        time.sleep(0.4)
        app.run()
    assert job.done, f"training did not finish: {job.stage}"
    assert job.error is None, job.error
    app.run()
    assert not app.exception, [e.value for e in app.exception]
    assert saw_progress or len(job.history) == 3, "progress was shown while training"
    assert app.get("vega_lite_chart"), "the loss / validation-NLL chart"
    assert [h["epoch"] for h in job.history] == [1, 2, 3]
    assert any("is in the run store" in s.value for s in app.success)
    runs = {r.run_id: r for r in RunStore().list()}
    assert job.run_id in runs and job.run_id not in before
    run = runs[job.run_id]
    assert not run.bundled and run.path.parent == store
    assert (run.path / "grid.parquet").is_file() and (run.path / "model" / "model.safetensors").is_file()
    assert run.manifest["config"]["settings"] == {"epochs": 3, "rank": 8, "hidden": 8, "batch_size": 2048}
    assert app.session_state["ua_run"] == job.run_id, "the new run becomes the active run"
    assert f"{len(before) + 1} in the store" in "\n".join(m.value for m in app.sidebar.markdown)
    # the result's coverage with its band: a random split's two binomial SEs over the run's test rows
    from gpcore.run.rundir import read_test_predictions

    n = len(read_test_predictions(run.path))
    cov = next(r["coverage"] for r in run.manifest["metrics"] if r["group"] == "all")
    two_se = 2 * np.sqrt(0.95 * 0.05 / n)
    shown = next(m for m in app.metric if m.label == "95% coverage")
    assert shown.value == f"{100 * cov:.1f}% ± {100 * two_se:.1f}" + (" ✗" if abs(cov - 0.95) > two_se else "")
    assert "binomial" in shown.help


def test_cancel_keeps_the_best_model_so_far(store):
    """The job's Cancel: training stops after the current epoch and the run is still written."""
    from app.jobs import start_training
    from tests.app.conftest import tiny_config

    cfg = tiny_config()
    cfg = type(cfg).from_dict({**cfg.to_dict(), "settings": {**cfg.settings, "epochs": 200}})
    job = start_training(cfg, store / "cancelled-run")
    deadline = time.time() + 60
    while not job.history and time.time() < deadline:
        time.sleep(0.05)
    job.cancel()
    assert job.wait(120)
    assert job.error is None, job.error
    assert job.cancelled and len(job.history) < 200
    manifest = json.loads((store / "cancelled-run" / "run.json").read_text())
    assert manifest["train_info"]["cancelled"] is True


@pytest.mark.parametrize("check", [True, False])
def test_dbk_nn_trains_from_the_page_with_one_epoch_count_across_its_stages(app, store, check):
    """dbk-nn trains in stages (DBK, the hybrid residual, the feature check's residual-only refit); the page's
    progress counts epochs 1, 2, ... across them, and the run lands in the store as a dbk-nn run. Unticking
    "feature check" skips the refit and the note."""
    from gpcore.run.store import RunStore

    app.run()
    open_page(app, "train").run()
    app.selectbox(key="w_model").select("dbk-nn").run()
    assert not app.exception, [e.value for e in app.exception]
    for name, value in (("dbk_epochs", 2), ("epochs", 2), ("dbk_rank", 8), ("neighbors", 8), ("dbk_hidden", 8),
                        ("dbk_batch_size", 2048)):
        app.number_input(key=f"w_set_dbk-nn_{name}").set_value(value)
    box = app.checkbox(key="w_set_dbk-nn_feature_check")
    assert box.value is True, "the check is on by default"
    if not check:
        box.uncheck()
    app.number_input(key="w_cell_km").set_value(4.0)
    app.button(key="w_train").click().run()
    assert not app.exception, [e.value for e in app.exception]
    job = wait_for_job(app, 240, poll=0.5)
    epochs = [h["epoch"] for h in job.history]
    assert epochs == list(range(1, len(epochs) + 1)) and len(epochs) >= 3, epochs  # stage 1 then the residual
    # DBK 2 + hybrid 2 (+ the feature check's residual-only 2)
    assert {h["epochs"] for h in job.history} == {6 if check else 4}
    run = {r.run_id: r for r in RunStore().list()}[job.run_id]
    assert run.manifest["config"]["model"] == "dbk-nn"
    assert run.manifest["config"]["settings"].get("feature_check", True) is check  # defaults are not written
    assert any("is in the run store" in s.value for s in app.success)
    if not check:
        assert "feature_check" not in run.manifest["train_info"]
        assert not [i.value for i in app.info if "DBK features were dropped" in i.value]
        return
    # whichever of the two validates better on this tiny fit, the page says what the check decided, in its numbers
    check = run.manifest["train_info"]["feature_check"]
    notes = [i.value for i in app.info if "DBK features were dropped" in i.value]
    tie = 1e-3  # dbk-nn's min_improvement: a smaller gain of the features is a tie, which drops them
    if check["kept"]:
        assert check["with_features"] < check["residual_only"] - tie and not notes, [i.value for i in app.info]
        return
    screen = check["screen"]
    if check["hybrid_fitted"]:  # the hybrid was fitted and did not beat the residual alone by min_improvement
        assert check["with_features"] >= check["residual_only"] - tie
    else:  # the screen's gate: no weight for the features, or a gain within one paired standard error
        assert screen["a"] == 0 or check["residual_only"] - check["with_features"] <= screen["gain_se"]
    assert len(notes) == 1 and f"{check['residual_only']:.4f}" in notes[0], [i.value for i in app.info]
