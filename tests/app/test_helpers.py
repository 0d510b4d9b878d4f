"""The dashboard's pure helpers: colours, rasterised grids, deck specs, the grid map's lookup, URLs."""

from __future__ import annotations

import json

import numpy as np
import pytest

from app import layers as L
from app import raster as R
from app.colors import ColorScale, format_number, legend_html, lut, robust_limits
from gpcore.errors import DataError


def test_colour_index_is_quantised_with_a_transparent_slot():
    s = ColorScale("viridis", 0.0, 10.0)
    idx = s.index(np.array([-5.0, 0.0, 5.0, 10.0, 50.0, np.nan, np.inf]))
    assert idx.dtype == np.uint8
    assert idx.tolist() == [1, 1, 128, 255, 255, 0, 0]
    assert lut("viridis").shape == (256, 3)
    assert tuple(lut("viridis")[1]) == (68, 1, 84)  # viridis starts dark purple


def test_limits_and_labels():
    lo, hi = robust_limits(np.r_[np.linspace(0, 1, 98), 100.0, -100.0], q=0.02)
    assert -100 < lo <= 0.05 and 0.95 <= hi < 100
    assert robust_limits(np.array([3.0, 3.0])) == (2.5, 3.5)
    sym = robust_limits(np.array([-2.0, 1.0]), symmetric=True)
    assert sym[0] == -sym[1] > -2.01
    s = ColorScale("viridis", 0.0, 2.0, label=lambda v: format_number(10**v))
    assert [t for _, t in s.ticks(3)] == ["1", "10", "100"]
    html = legend_html(s, "mean <Mbps>")
    assert "linear-gradient" in html and "mean &lt;Mbps&gt;" in html


def square_grid(nx=30, ny=20, step=0.01, lon0=-66.5, lat0=18.0):
    lon, lat = np.meshgrid(lon0 + step * (np.arange(nx) + 0.5), lat0 + step * (np.arange(ny) + 0.5))
    return lon.ravel(), lat.ravel(), step


def test_raster_index_shows_every_cell_where_it_is():
    lon, lat, step = square_grid()
    hw, hh = R.spacing_half_sizes(lon, lat)
    assert hw[0] == pytest.approx(step / 2, rel=0.02) and hh[0] == pytest.approx(step / 2, rel=0.02)
    ri = R.build_raster_index(lon, lat, hw, hh, px_per_cell=3)
    assert ri.coverage == 1.0
    W, S, E, N = ri.bounds
    assert (W, E) == pytest.approx((-66.5, -66.5 + 30 * step), abs=1e-3)
    # the pixel in the north-west corner shows the north-west cell
    nw = int(np.argmin(lon - lat))
    assert ri.pix2cell[0] == nw
    png = R.palette_png(np.arange(lon.size) % 255 + 1, ri, "viridis")
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    assert R.data_url(png).startswith("data:image/png;base64,")


def test_raster_leaves_gaps_transparent():
    lon, lat, step = square_grid(10, 10)
    keep = ~((lon > -66.47) & (lon < -66.43))  # a gap three cells wide
    hw, hh = np.full(keep.sum(), step / 2), np.full(keep.sum(), step / 2)
    ri = R.build_raster_index(lon[keep], lat[keep], hw, hh)
    assert (ri.pix2cell == ri.n_cells).any()


def test_deck_spec_splices_raw_json_and_has_no_basemap_offline():
    dots = L.points_json([-66.0, -66.1], [18.0, 18.1], np.array([[1, 2, 3], [4, 5, 6]]), {"v": ["1", "2"]})
    spec = L.deck_spec([L.points_layer("measurements", L.Raw(dots))], L.view_for_bounds((-67, 17.8, -65, 18.6)))
    d = json.loads(spec)
    assert d["mapStyle"] == "__MAP_STYLE__"  # Streamlit's "no basemap" sentinel: no tile requests
    assert d["layers"][0]["data"] == [
        {"p": [-66.0, 18.0], "c": [1, 2, 3], "v": "1"}, {"p": [-66.1, 18.1], "c": [4, 5, 6], "v": "2"}
    ]
    assert d["layers"][0]["getPosition"] == "@@=p"
    online = json.loads(L.deck_spec([], L.view_for_bounds((0, 0, 1, 1)), basemap=True))
    assert "cartocdn" in online["mapStyle"]
    deck = L.PrebuiltDeck(spec, tooltip=L.tooltip("{v}"))
    assert deck.to_json() == spec and deck.nbytes == len(spec)


def test_view_fits_the_bounds():
    v = L.view_for_bounds((-67.3, 17.9, -65.2, 18.5), width_px=600, height_px=400)
    assert -66.3 < v["longitude"] < -66.2 and 18.1 < v["latitude"] < 18.3
    assert 7 < v["zoom"] < 9


def test_grid_map_lookup_round_trips_the_pixel_to_cell_index():
    """What the browser decodes (index PNG, float32 values) is the raster index and the grid's values."""
    import base64
    import io

    from PIL import Image

    from app import gridmap

    lon, lat = np.meshgrid(np.linspace(-67, -66, 40), np.linspace(18, 18.4, 30))
    lon, lat = lon.ravel(), lat.ravel()
    keep = np.arange(lon.size) % 7 != 3  # holes: pixels with no cell
    lon, lat = lon[keep], lat[keep]
    hw, hh = np.full(lon.size, 1 / 78), np.full(lon.size, 0.2 / 29)
    ri = R.build_raster_index(lon, lat, hw, hh)
    values = {"m": np.linspace(1, 2, lon.size), "lo": np.zeros(lon.size), "hi": np.ones(lon.size),
              "w": np.ones(lon.size), "wt": np.full(lon.size, 0.5)}
    lk = gridmap.lookup(ri, np.arange(lon.size) + 100, values, "Mbps", "log10(Mbps)", key="k")
    png = base64.b64decode(lk["index_png"].split(",", 1)[1])
    rgb = np.asarray(Image.open(io.BytesIO(png)).convert("RGB"), dtype=np.int64).reshape(-1, 3)
    decoded = (rgb[:, 0] << 16) | (rgb[:, 1] << 8) | rgb[:, 2]
    want = np.where(ri.pix2cell >= ri.n_cells, gridmap.NO_CELL, ri.pix2cell)
    np.testing.assert_array_equal(decoded, want)
    assert (decoded == gridmap.NO_CELL).any() and (decoded < lon.size).any()
    ids = np.frombuffer(base64.b64decode(lk["ids"]), dtype=np.int32)
    np.testing.assert_array_equal(ids, np.arange(lon.size) + 100)
    m = np.frombuffer(base64.b64decode(lk["vals"]["m"]), dtype=np.float32)
    np.testing.assert_allclose(m, values["m"], rtol=1e-6)
    assert (lk["w"], lk["h"], lk["bounds"]) == (ri.width, ri.height, list(ri.bounds))
    assert gridmap.picked_cell({"cell": 5, "lon": 0, "lat": 0}) == 5
    assert gridmap.picked_cell(None) is None and gridmap.picked_cell({"cell": -1}) is None
    assert gridmap.picked_cell({"cell": "x"}) is None


def test_dataset_spec_round_trips_through_the_url():
    from app.state import DatasetSpec, format_xref, parse_xref

    spec = DatasetSpec(quarter="2023Q2", transform="log", strata=None, weight="tests")
    back = DatasetSpec.from_query(spec.to_query())
    assert back == spec
    with pytest.raises(DataError, match="not allowed"):  # URLs may name samples and uploads only
        DatasetSpec.from_query({"data": "file:/etc/passwd"})
    assert parse_xref(format_xref((-66.123456, 18.5))) == (-66.12346, 18.5)
    assert parse_xref("1,2,3") is None and parse_xref("200,0") is None


def test_setting_widgets_come_from_config_metadata():
    """Every registered model's settings can be drawn (no page change when a model is added)."""
    from dataclasses import fields

    from gpcore.models import available_models, model_spec

    for name in available_models():
        cfg = model_spec(name).cls.Config
        main = [f for f in fields(cfg) if (f.metadata or {}).get("main")]
        assert main, f"{name} has no main settings"
        for f in fields(cfg):
            assert isinstance(f.default, (bool, int, float, str)), (name, f.name)


def test_cli_command_reproduces_a_config():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "app" / "app_pages" / "export.py"
    src = path.read_text().replace("\npage()\n", "\n")
    ns: dict = {}
    exec(compile(src, str(path), "exec"), ns)  # the page module without drawing it
    cmd = ns["cli_command"]({"data": "sample:puerto_rico", "y": "download_mbps", "transform": "log10",
                             "quarter": "2023", "strata": "county_metro", "seed": 0, "model": "dbk-rbf",
                             "settings": {"epochs": 5}, "grid_cell_km": 1.0})
    assert "--data sample:puerto_rico" in cmd and "--set epochs=5" in cmd and "--cell-km 1" in cmd
    assert importlib.util.find_spec("gpcore") is not None


def test_widths_violins_split_by_stratum():
    import pandas as pd

    from app.charts import coverage_bars, width_violins

    test = pd.DataFrame({"model": ["a"] * 4 + ["b"] * 4, "var_y": [0.1, 0.2, 0.1, 0.3] * 2,
                         "stratum": ["metro", "non-metro"] * 4, "mean": 0.0, "y": 0.1})
    fig = width_violins(test, "log10(Mbps)")
    assert [t.type for t in fig.data] == ["violin"] * 4, "one violin per (stratum, model)"
    assert {t.name for t in fig.data} == {"metro (urban)", "non-metro (rural)"}
    assert [t.name for t in fig.data if t.showlegend] == ["metro (urban)", "non-metro (rural)"]
    assert float(fig.data[0].y[0]) == pytest.approx(2 * 1.959964 * np.sqrt(0.1), rel=1e-5)
    metrics = pd.DataFrame({"model": ["a", "a"], "group": ["metro", "non-metro"], "coverage": [0.9, 0.97]})
    assert coverage_bars(metrics).layout.shapes[0].y0 == 0.95
    # the few 'unknown' points (no bar) do not stretch the axis; a band becomes the bars' error bars
    banded = pd.concat([metrics, pd.DataFrame({"model": ["a"], "group": ["unknown"], "coverage": [0.5]})])
    fig = coverage_bars(banded.assign(two_se=[0.01, 0.02, 0.4]))
    assert fig.layout.yaxis.range[0] == pytest.approx(0.8) and {t.name for t in fig.data} == {
        "metro (urban)", "non-metro (rural)"}
    assert [list(t.error_y.array) for t in fig.data] == [[0.01], [0.02]] and fig.data[0].error_y.visible
    assert not coverage_bars(metrics).data[0].error_y.visible, "no band, no error bars"
    # a few tiles outside every stratum ('unknown', no violin) with wide intervals do not stretch the axis
    wide = pd.concat([test, pd.DataFrame({"model": ["a"], "var_y": [25.0], "stratum": ["unknown"], "mean": 0.0,
                                          "y": 0.1})])
    top = width_violins(wide).layout.yaxis.range[1]
    assert top == width_violins(test).layout.yaxis.range[1] and top < 2 * 1.96 * np.sqrt(0.3) * 1.2


def test_widths_and_calibration_use_each_runs_noise_shape():
    """Two runs side by side, one with a skewed predictive (its shape in its test rows' columns): its widths and its
    calibration curve are the mixture's, the other's stay Gaussian."""
    import pandas as pd

    from app.charts import calibration, test_widths
    from gpcore import metrics as M
    from gpcore.models.noise_shape import NoiseShape

    shape = NoiseShape(latent_scale=0.7, c1=1.3, c2=0.01, pi=0.3, offset=0.9)
    rng = np.random.default_rng(0)
    var_f, s = rng.uniform(0.01, 0.1, 200), rng.uniform(0.05, 0.3, 200)
    y = rng.normal(size=200)
    a = pd.DataFrame({"model": "a", "mean": 0.0, "y": y, "var_f": var_f, "var_y": var_f + shape.noise_factor() * s})
    b = a.assign(model="b", var_y=var_f + s)
    test = pd.concat([b, a.assign(**shape.columns())], ignore_index=True)
    widths = test_widths(test).to_numpy()
    lo, hi = shape.interval(0.95, var_f, s)
    np.testing.assert_allclose(widths[200:], hi - lo)
    np.testing.assert_allclose(widths[:200], M.interval_width(var_f + s))
    fig = calibration(test)
    (shaped,) = [t for t in fig.data if t.name == "a"]
    lo90, hi90 = shape.interval(0.9, var_f, s)
    assert list(shaped.x).index(0.9) >= 0
    assert shaped.y[list(shaped.x).index(0.9)] == pytest.approx(np.mean((y >= lo90) & (y <= hi90)))


def test_width_map_title_says_for_how_many_measurements():
    from types import SimpleNamespace

    import pandas as pd

    from app.mapview import grid_scale
    from gpcore.data import get_transform

    run = SimpleNamespace(grid=pd.DataFrame({"width_t": [0.5, 1.0], "width": [3.0, 9.0]}), transform=get_transform(
        "log10"), t_units="log10(Mbps)", units="Mbps", target="download_mbps",
        manifest={"weights": {"column": "tests", "grid_measurements": 1}, "recalibration": {"kind": "group"}})
    title = grid_scale(run, "width", "viridis")[2]
    assert "for a value from 1 measurement (tests = 1)" in title and "recalibrated" in title
    run.manifest = {}
    assert grid_scale(run, "width", "viridis")[2] == "95% prediction-interval width (log10(Mbps))"


def test_every_chart_gives_a_stratum_the_same_colour_and_many_strata_stay_violins():
    import pandas as pd

    from app.charts import DISPLAY, coverage_bars, stratum_colors, width_violins
    from app.safe_html import html_text

    strata = ["INLAND", "NEAR BAY", "<1H OCEAN", "NEAR OCEAN", "ISLAND"]
    rng = np.random.default_rng(0)
    test = pd.DataFrame({"model": np.repeat(["dbk-rbf", "svgp"], 50), "var_y": rng.uniform(0.01, 0.1, 100),
                         "stratum": np.tile(strata, 20), "mean": 0.0, "y": 0.1})
    metrics = pd.DataFrame({"model": np.repeat(["dbk-rbf", "svgp"], 6), "group": ["all", *strata] * 2,
                            "coverage": rng.uniform(0.9, 0.99, 12)})
    colors = stratum_colors([*strata, "all"])
    assert len({colors[s] for s in strata}) == len(strata), "a colour of its own per stratum"
    violins = width_violins(test, "log10(y)", colors)
    bars = coverage_bars(metrics, colors=colors)
    # trace names are HTML to plotly: '<1H OCEAN' is sent escaped (app.safe_html) and shown as written
    assert [t.name for t in violins.data if t.showlegend] == [html_text(s) for s in sorted(strata)]
    assert len(violins.data) == 2 * len(strata), "each (model, stratum) violin is scaled on its own"
    assert all(len(set(t.x)) == 1 for t in violins.data)
    by_name = {t.name: t.line.color for t in violins.data}
    for t in bars.data:
        if t.name != "all":
            assert t.marker.color == by_name[t.name], t.name
    assert all(t.scalemode == "width" and t.side == "both" for t in violins.data), "full violins, same width"
    assert violins.layout.violinmode == "group"
    # two strata: halves of one violin, urban left, the colours of urban and rural
    two = width_violins(test.assign(stratum=np.tile(["non-metro", "metro"], 50)), "")
    halves = {(t.name, t.side) for t in two.data}
    assert halves == {(DISPLAY["metro"], "negative"), (DISPLAY["non-metro"], "positive")}
    lo, hi = bars.layout.yaxis.range
    assert lo <= 0.8 and hi > 1.0, "the 95 % line in context and the bar labels inside the axis"


def test_measurement_maps_draw_a_fixed_sample_of_large_data_sets():
    from app.cache import MAP_POINTS, map_sample, map_sample_note

    np.testing.assert_array_equal(map_sample(10), np.arange(10))
    assert map_sample_note(MAP_POINTS) == ""
    idx = map_sample(3 * MAP_POINTS)
    assert len(idx) == MAP_POINTS == len(np.unique(idx)) and np.all(np.diff(idx) > 0)
    np.testing.assert_array_equal(idx, map_sample(3 * MAP_POINTS)), "the same sample on every visit"
    assert f"{MAP_POINTS:,} of the {3 * MAP_POINTS:,}" in map_sample_note(3 * MAP_POINTS)
