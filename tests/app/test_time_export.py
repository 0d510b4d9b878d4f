"""The Export page of a run with time as an input (issue 23 part 3): the grid at the quarter slider's quarter (shared
with Maps and Decide, in the URL) and the change between the Change map's two quarters, as CSV, GeoJSON and
GeoTIFF. A run without time keeps its one grid. Widgets only; downloads are run as a click runs them."""

from __future__ import annotations

import io

import numpy as np
import pandas as pd

from tests.app.conftest import PLAIN_RUN, TIME_RUN, download, linked_page, open_page


def test_the_grid_is_exported_at_the_sliders_quarter(time_env, deferred):
    at = linked_page("export", TIME_RUN)
    slider = at.select_slider(key="w_quarter")
    assert slider.value == "2020Q4", "a time run opens at its latest quarter"
    name, data = download(at, deferred, "w_dl_csv")
    assert name == f"{TIME_RUN}-2020Q4.csv"
    grids = time_env / TIME_RUN / "grids"
    np.testing.assert_allclose(pd.read_csv(io.BytesIO(data))["mean_t"],
                               pd.read_parquet(grids / "2020Q4.parquet")["mean_t"], rtol=1e-6)

    slider.set_value("2019Q2").run()
    assert not at.exception, [e.value for e in at.exception]
    assert at.query_params["at"] == "2019Q2"
    assert any(c.value.startswith("The grid at 2019Q2.") for c in at.caption)
    name, data = download(at, deferred, "w_dl_csv")
    assert name == f"{TIME_RUN}-2019Q2.csv"
    early = pd.read_csv(io.BytesIO(data))["mean_t"]
    np.testing.assert_allclose(early, pd.read_parquet(grids / "2019Q2.parquet")["mean_t"], rtol=1e-6)
    assert not np.allclose(early, pd.read_parquet(grids / "2020Q4.parquet")["mean_t"])
    assert download(at, deferred, "w_dl_tif")[0] == f"{TIME_RUN}-2019Q2.tif"

    open_page(at, "maps").run()  # the slider is one view-state value: Maps shows the quarter Export exported
    assert at.select_slider(key="w_quarter").value == "2019Q2"


def test_the_change_between_the_change_maps_quarters_is_exported(time_env, deferred):
    import rasterio

    from gpcore.run.change import run_change

    at = linked_page("maps", TIME_RUN)
    at.segmented_control(key="w_map_kind").set_value("change").run()
    at.selectbox(key="w_change_from").select("2019Q3").run()
    assert not at.exception, [e.value for e in at.exception]
    open_page(at, "export").run()
    assert "Change between two quarters" in [h.value for h in at.subheader]
    assert (at.selectbox(key="w_change_from").value, at.selectbox(key="w_change_to").value) == ("2019Q3", "2020Q4")
    assert not at.get("download_button") or all("w_dl_change" not in b.proto.id for b in at.get("download_button"))

    at.toggle(key="w_export_change").set_value(True).run()
    assert not at.exception, [e.value for e in at.exception]
    name, data = download(at, deferred, "w_dl_change_csv")
    assert name == f"{TIME_RUN}-change-2019Q3-2020Q4.csv"
    got = pd.read_csv(io.BytesIO(data))
    want = run_change(time_env / TIME_RUN, "2019Q3", "2020Q4").table
    assert got["cell_id"].tolist() == want["cell_id"].tolist()
    for col in ("change_mean", "change_sd", "change_lo", "change_hi", "p_increase"):
        np.testing.assert_allclose(got[col], want[col], rtol=1e-9, atol=1e-12)
    assert any("likely improved" in c.value for c in at.caption)

    name, data = download(at, deferred, "w_dl_change_geotiff")
    assert name.endswith(".tif")
    with rasterio.open(io.BytesIO(data)) as src:
        assert src.descriptions == ("change_mean", "change_sd", "change_lo", "change_hi", "p_increase")
        p = src.read(5)
    np.testing.assert_allclose(np.sort(p[np.isfinite(p)]), np.sort(want["p_increase"]), rtol=1e-6)

    at.selectbox(key="w_change_to").select("2019Q3").run()
    assert any("two different quarters" in i.value for i in at.info)


def test_a_run_without_time_exports_its_one_grid(time_env, deferred):
    at = linked_page("export", PLAIN_RUN)
    assert list(at.get("select_slider")) == []
    assert "Change between two quarters" not in [h.value for h in at.subheader]
    assert download(at, deferred, "w_dl_csv")[0] == f"{PLAIN_RUN}.csv"
