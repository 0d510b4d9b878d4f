"""The Decide page, driven by widget interactions: threshold map, areas (click one), plausible maps, suggestions.

Every number shown is checked against :mod:`gpcore.decide` on the same run (the page only draws it).
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from scipy.stats import norm

from tests.app.conftest import click_grid, gridmaps, open_page

RUN = "20240101-000000-000-dbk-rbf"


def open_decide(app):
    app.query_params["run"] = RUN
    app.run()
    open_page(app, "decide").run()
    assert not app.exception, [e.value for e in app.exception]
    return app


def test_threshold_map_is_p_below_of_the_run(app, store):
    from gpcore.models import load_model

    open_decide(app)
    assert app.session_state["ua_run"] == RUN
    assert app.number_input(key="w_decide_threshold").value == 35.0, "mobile download: the FCC's 35 Mbps"
    maps = gridmaps(app)
    assert f"exceed_{RUN}" in maps and f"area_{RUN}" in maps
    assert sum(k.startswith("sample_") for k in maps) == 4, "four plausible maps side by side"
    grid = pd.read_parquet(store / RUN / "grid.parquet")
    model = load_model(store / RUN / "model")
    var_f = np.maximum(grid["sd_t"] ** 2 - model.noise_variance, 0)
    p = norm.cdf((np.log10(35.0) - grid["mean_t"]) / np.sqrt(var_f))
    caption = next(c.value for c in app.caption if "undecided" in c.value)
    assert f"{int((p > 0.8).sum()):,} of {len(grid):,} cells" in caption
    # a new threshold redraws the map and the areas
    app.number_input(key="w_decide_threshold").set_value(10.0).run()
    assert not app.exception
    p10 = norm.cdf((1.0 - grid["mean_t"]) / np.sqrt(var_f))
    caption = next(c.value for c in app.caption if "undecided" in c.value)
    assert f"{int((p10 > 0.8).sum()):,} of {len(grid):,} cells" in caption
    app.segmented_control(key="w_decide_direction").set_value("above").run()
    caption = next(c.value for c in app.caption if "undecided" in c.value)
    assert f"{int((p10 < 0.2).sum()):,} of {len(grid):,} cells are likely above" in caption


def test_click_an_area_shows_its_posterior(app, store):
    from gpcore import decide
    from gpcore.models import load_model

    open_decide(app)
    assert any("Click an area" in i.value for i in app.info)
    grid = pd.read_parquet(store / RUN / "grid.parquet")
    labels = decide.assign_areas(grid["lon"], grid["lat"], decide.bundled_counties("PR"), "NAME")
    i = int(np.flatnonzero(labels == "San Juan")[0])
    click_grid(app, f"area_{RUN}", i, float(grid.lon.iloc[i]), float(grid.lat.iloc[i]))
    assert not app.exception, [e.value for e in app.exception]
    assert app.session_state["ua_decide_area"] == "San Juan"
    assert any(m.value == "**San Juan**" for m in app.markdown)
    model = load_model(store / RUN / "model")
    tab = decide.area_posteriors(model, grid[["lon", "lat"]].to_numpy(), labels, threshold=35.0,
                                 units="original", transform="log10")
    row = tab[tab.area == "San Juan"].iloc[0]
    metrics = {m.label: m.value for m in app.metric}
    assert metrics["P(area mean below)"] == f"{row.p_below:.3f}"
    from app.colors import format_number

    assert metrics["Area mean"] == f"{format_number(row['mean'])} Mbps"
    shown = app.dataframe[0].value
    assert len(shown) == len(tab) and shown["P(below)"].is_monotonic_decreasing, "ranked by P(below)"
    # by cell area instead of uniformly: the table is recomputed
    app.radio(key="w_decide_weights").set_value("area").run()
    assert not app.exception
    app.radio(key="w_decide_areas").set_value("strata").run()
    assert not app.exception
    assert set(app.dataframe[0].value["area"]) <= {"metro", "non-metro", "unknown"}


def test_plausible_maps_redraw_with_another_seed(app, store):
    open_decide(app)
    before = {k: a["image"] for k, a in gridmaps(app).items() if k.startswith("sample_")}
    app.button(key="w_decide_redraw").click().run()
    assert not app.exception
    assert app.number_input(key="w_decide_seed").value == 1
    after = {k: a["image"] for k, a in gridmaps(app).items() if k.startswith("sample_")}
    assert before.keys() == after.keys() and all(before[k] != after[k] for k in before)
    app.number_input(key="w_decide_seed").set_value(0).run()
    again = {k: a["image"] for k, a in gridmaps(app).items() if k.startswith("sample_")}
    assert again == before, "the same seed draws the same maps"


def test_suggest_sites(app, store):
    from gpcore import decide
    from gpcore.models import load_model

    open_decide(app)
    assert any("press Suggest sites" in i.value for i in app.info)
    app.slider(key="w_decide_k").set_value(3).run()
    app.button(key="w_decide_suggest").click().run()
    assert not app.exception, [e.value for e in app.exception]
    shown = app.dataframe[-1].value
    assert list(shown["site"]) == [1, 2, 3]
    grid = pd.read_parquet(store / RUN / "grid.parquet")
    X = grid[["lon", "lat"]].to_numpy()
    res = decide.suggest(load_model(store / RUN / "model"), X, X, k=3)
    assert list(shown["cell_id"]) == list(grid["cell_id"].to_numpy()[res.index])
    np.testing.assert_allclose(shown["variance reduction"], res.reduction, rtol=1e-6)
    labels = gridmaps(app)[f"suggest_{RUN}"]["labels"]
    assert [lab["text"] for lab in labels] == ["1", "2", "3"], "numbered markers on the variance-after map"
    # undecided cells at a threshold near the median, and a minimum spacing
    app.number_input(key="w_decide_threshold").set_value(float(10 ** np.median(grid["mean_t"]))).run()
    app.selectbox(key="w_decide_target").set_value("undecided").run()
    app.number_input(key="w_decide_min_km").set_value(20.0).run()
    app.button(key="w_decide_suggest").click().run()
    assert not app.exception
    assert not app.warning, [w.value for w in app.warning]
    assert any("undecided cells" in c.value for c in app.caption)
    shown = app.dataframe[-1].value
    d = decide.haversine_km(shown.lon.to_numpy()[:, None], shown.lat.to_numpy()[:, None],
                            shown.lon.to_numpy()[None], shown.lat.to_numpy()[None])
    assert (d[~np.eye(len(shown), dtype=bool)] >= 20.0).all()


def test_maps_draws_p_below_at_the_decide_threshold(app, store):
    """The threshold set on Decide is a canonical value: the Maps page's P(below) layer uses it."""
    from app import raster as R
    from app.colors import ColorScale
    from gpcore.models import load_model

    open_decide(app)
    app.number_input(key="w_decide_threshold").set_value(12.0).run()
    assert app.session_state["ua_threshold"] == 12.0
    open_page(app, "maps").run()
    app.segmented_control(key="w_map_kind").set_value("exceed").run()
    assert not app.exception, [e.value for e in app.exception]
    assert app.query_params["map"] == "exceed"
    grid = pd.read_parquet(store / RUN / "grid.parquet")
    model = load_model(store / RUN / "model")
    # the stored sd_t holds a recalibrated run's variance scale (strata runs recalibrate); var_f does not
    var_f = np.maximum(grid["sd_t"].to_numpy() ** 2 / model.variance_scale(len(grid)) - model.noise_variance, 0)
    p = norm.cdf((np.log10(12.0) - grid["mean_t"].to_numpy()) / np.sqrt(var_f))
    hw, hh = R.spacing_half_sizes(grid["lon"].to_numpy(), grid["lat"].to_numpy())
    raster = R.build_raster_index(grid["lon"].to_numpy(), grid["lat"].to_numpy(), np.full(len(grid), hw[0]),
                                  np.full(len(grid), hh[0]))
    scale = ColorScale("rdbu", 0.0, 1.0)
    expected = R.data_url(R.palette_png(scale.index(p), raster, scale.name))
    assert gridmaps(app)[f"pick_{RUN}"]["image"] == expected
    # back on Decide the threshold is still 12
    open_page(app, "decide").run()
    assert app.number_input(key="w_decide_threshold").value == 12.0


def test_a_vecchia_run_decides_with_its_joint_posterior(app, store):
    """vecchia (and dbk-nn) used to give marginals only, and the page hid its joint sections for them; with the joint
    Vecchia posterior (issue 25) the page shows areas, plausible maps and suggestions, each the numbers of
    :mod:`gpcore.decide` on the same run."""
    from app.state import DatasetSpec
    from gpcore import decide
    from gpcore.models import load_model
    from gpcore.run.pipeline import execute_run

    run_id = "20240101-000002-000-vecchia"
    cfg = DatasetSpec().run_config(model="vecchia", settings={"epochs": 2, "neighbors": 8}, grid_cell_km=4.0,
                                   label="vecchia tiny")
    execute_run(cfg, store / run_id)
    app.query_params["run"] = run_id
    app.run()
    open_page(app, "decide").run()
    assert not app.exception, [e.value for e in app.exception]
    assert app.session_state["ua_run"] == run_id
    assert not app.error and not [w.value for w in app.warning if "joint posterior" in w.value]
    maps = gridmaps(app)
    assert f"exceed_{run_id}" in maps and f"area_{run_id}" in maps
    assert sum(k.startswith("sample_") for k in maps) == 4, "four plausible maps"
    assert [s.value for s in app.subheader] == ["P(download_mbps below 35 Mbps)", "Areas", "Plausible maps",
                                                "Where to measure next"]
    grid = pd.read_parquet(store / run_id / "grid.parquet")
    model = load_model(store / run_id / "model")
    labels = decide.assign_areas(grid["lon"], grid["lat"], decide.bundled_counties("PR"), "NAME")
    tab = decide.area_posteriors(model, grid[["lon", "lat"]].to_numpy(), labels, threshold=35.0,
                                 units="original", transform="log10")
    shown = app.dataframe[0].value
    assert len(shown) == len(tab)
    assert np.allclose(np.sort(shown["P(below)"].to_numpy(float)), np.sort(tab["p_below"].to_numpy()), atol=1e-3)
    app.slider(key="w_decide_k").set_value(3).run()
    app.button(key="w_decide_suggest").click().run()
    assert not app.exception, [e.value for e in app.exception]
    X = grid[["lon", "lat"]].to_numpy()
    res = decide.suggest(model, X, X, k=3)
    assert list(app.dataframe[-1].value["cell_id"]) == list(grid["cell_id"].to_numpy()[res.index])
    assert res.engine == "vecchia"
