"""Every page renders on the sample data; bad uploads keep the data set; the URL restores a view."""

from __future__ import annotations

import json

import pandas as pd
import pytest
from streamlit.testing.v1 import AppTest

from tests.app.conftest import APP, TIMEOUT, gridmaps, open_page

PAGES = ["train", "maps", "compare", "decide",
         "export"]


def no_exceptions(at: AppTest) -> None:
    assert not at.exception, [e.value for e in at.exception]


def sidebar_text(at: AppTest) -> str:
    return "\n".join(m.value for m in at.sidebar.markdown)


def n_runs(split: str | None = None) -> int:
    """Runs in the test store plus the bundled ready run(s) (only those tested on ``split``, if given)."""
    from gpcore.run.store import RunStore

    return len([r for r in RunStore().list() if split in (None, r.manifest["config"].get("split", "random"))])


def test_every_page_renders_on_the_sample(app, store):
    app.run()
    no_exceptions(app)
    assert "Puerto Rico" in sidebar_text(app)
    assert "CPU" in sidebar_text(app) or "GPU" in sidebar_text(app)
    assert f"{n_runs()} in the store, {n_runs()} on this data set" in sidebar_text(app)
    for page in PAGES:
        open_page(app, page).run()
        no_exceptions(app)
        assert not app.error, (page, [e.value for e in app.error])
    assert app.title[0].value == "Export"


def test_fresh_install_shows_a_ready_comparison(empty_store):
    """With an empty run store the bundled ready runs fill Maps and Compare, all on the default data set."""
    from gpcore.models import DEFAULT_MODEL
    from gpcore.run.store import RunStore

    bundled = [r for r in RunStore().list() if r.bundled]
    models = {r.model for r in bundled}
    assert {DEFAULT_MODEL, "vecchia", "dbk-rbf", "svgp", "ppgp"} <= models, "sample_data/runs/ holds the comparison"
    for model in (DEFAULT_MODEL, "vecchia"):  # the best models ship random and block runs, each with a grid
        runs = [r for r in bundled if r.model == model]
        assert {r.manifest["config"]["split"] for r in runs} == {"random", "block"}, model
        assert all((r.path / "grid.parquet").is_file() for r in runs), model
    at = AppTest.from_file(APP, default_timeout=TIMEOUT)
    at.query_params["xref"] = "-66.5,18.2"  # also load a bundled model: its kernel slice and interval
    at.run()
    no_exceptions(at)
    n = len(bundled)
    assert f"{n} in the store, {n} on this data set" in sidebar_text(at), "the ready runs are on the default data"
    active = at.sidebar.selectbox(key="w_sidebar_run").value
    assert next(r for r in bundled if r.run_id == active).model == DEFAULT_MODEL, "the default model's run opens first"
    open_page(at, "maps").run()
    no_exceptions(at)
    assert len(gridmaps(at)) == 2, "the Maps page shows the mean map and a kernel slice"
    assert "Posterior mean at x_ref" in {m.label for m in at.metric}
    open_page(at, "compare").run()
    no_exceptions(at)
    ranking = at.dataframe[0].value
    assert {DEFAULT_MODEL, "vecchia", "dbk-rbf", "svgp", "ppgp"} <= set(ranking["model"]), ranking
    best = ranking.loc[ranking["model"].isin([DEFAULT_MODEL, "vecchia"]), "rank"].min()
    assert best == 1, ("the default model (or vecchia, its residual alone) ranks first on the bundled data", ranking)
    assert len(at.get("plotly_chart")) == 4, "violins, coverage, calibration, timings"


def test_bad_upload_shows_the_error_and_keeps_the_data_set(app, store):
    app.run()
    before = app.session_state["ua_dataset"]
    app.radio(key="w_src_kind").set_value("Upload a file").run()
    no_exceptions(app)
    app.file_uploader(key="w_upload").upload("no_coords.csv", b"speed,name\n1,a\n2,b\n3,c\n", "text/csv").run()
    no_exceptions(app)
    errors = [e.value for e in app.error]
    assert any("no_coords.csv" in e for e in errors), errors
    assert app.session_state["ua_dataset"] == before
    assert "Puerto Rico" in sidebar_text(app)
    assert f"{n_runs()} in the store" in sidebar_text(app)


def test_good_upload_becomes_the_data_set_and_runs_stay(app, store, tmp_path):
    rows = pd.DataFrame({"lon": -66.5 + 0.01 * (pd.RangeIndex(60) % 10), "lat": 18.2 + 0.01 * (pd.RangeIndex(60) // 10),
                         "mbps": [10.0 + i for i in range(60)]})
    app.run()
    app.radio(key="w_src_kind").set_value("Upload a file").run()
    app.file_uploader(key="w_upload").upload("speeds.csv", rows.to_csv(index=False).encode(), "text/csv").run()
    no_exceptions(app)
    assert not app.error, [e.value for e in app.error]
    app.button(key="w_load_data").click().run()
    no_exceptions(app)
    spec = app.session_state["ua_dataset"]
    assert spec.source.startswith("upload:") and spec.source.endswith("speeds.csv")
    assert spec.y == "mbps"
    assert "speeds.csv" in sidebar_text(app)
    assert f"{n_runs()} in the store, 0 on this data set" in sidebar_text(app)
    assert store.joinpath("_uploads").is_dir(), "uploads are kept beside the runs (so a URL can name them)"


def test_query_parameters_restore_the_view(app, store):
    grid = pd.read_parquet(store / "20240101-000001-000-dbk-silu" / "grid.parquet")
    cell = grid.iloc[len(grid) // 3]
    xref = f"{cell.lon:.5f},{cell.lat:.5f}"
    app.query_params.update(
        {"data": "sample:puerto_rico", "quarter": "2023", "y": "download_mbps",
         "run": "20240101-000001-000-dbk-silu", "map": "width", "xref": xref}
    )
    app.run()
    open_page(app, "maps").run()
    no_exceptions(app)
    ss = app.session_state
    assert ss["ua_run"] == "20240101-000001-000-dbk-silu"
    assert ss["ua_map"] == "width"
    assert ss["ua_xref"] == pytest.approx((round(cell.lon, 5), round(cell.lat, 5)))
    assert any(f"cell `{int(cell.cell_id)}`" in m.value for m in app.markdown), "the kernel slice of the URL's x_ref"
    assert app.query_params["run"] == "20240101-000001-000-dbk-silu"
    assert app.query_params["xref"] == xref
    assert app.query_params["map"] == "width"


def test_a_bad_url_falls_back_to_the_sample(app, store):
    app.query_params.update({"data": "upload:0123456789abcdef/missing.csv", "run": "no-such-run", "xref": "x"})
    app.run()
    no_exceptions(app)
    assert app.session_state["ua_dataset"].source == "sample:puerto_rico"
    assert any("could not be loaded" in e.value for e in app.error)


def test_compare_draws_violins_for_two_runs(app, store):
    app.run()
    open_page(app, "compare").run()
    no_exceptions(app)
    charts = {c.proto.id: json.loads(c.proto.spec) for c in app.get("plotly_chart")}
    violins = [json.loads(c.proto.spec) for c in app.get("plotly_chart") if '"violin"' in c.proto.spec]
    assert violins, f"no violin chart among {len(charts)} charts"
    traces = violins[0]["data"]
    models = {x for t in traces for x in t["x"]}
    assert any(m.startswith("dbk-rbf") for m in models) and any(m.startswith("dbk-silu") for m in models), models
    strata = {t["name"] for t in traces}
    assert {"metro (urban)", "non-metro (rural)"} <= strata, strata
    ranking = app.dataframe[0].value
    n = n_runs("random")  # the page compares one test-split kind at a time, random first
    # dbk-silu's split seed is 1, the others' 0: other test rows, so a ranking of its own after seed 0's
    assert len(ranking) == n and list(ranking["test rows"]) == ["seed 0"] * (n - 1) + ["seed 1"]
    assert list(ranking["rank"]) == [*range(1, n), 1] and ranking["model"].iloc[-1].startswith("dbk-silu")
    assert ranking["nll"].iloc[:-1].astype(float).is_monotonic_increasing
    assert any("2 different sets of test rows" in w.value for w in app.warning)
    assert set(ranking["split"]) == {"Random"}
    assert {"mae", "rmse", "nll", "crps", "coverage", "pi_width_mean"} <= set(ranking.columns)
    # strata runs are recalibrated per stratum: the page shows their metrics before recalibration too
    assert "Without recalibration" in [h.value for h in app.subheader]
    before = app.dataframe[2].value
    assert len(before) and before["group"].str.endswith(" (no recalibration)").all()
    assert not app.dataframe[1].value["group"].str.endswith(" (no recalibration)").any()


def test_compare_says_which_runs_were_scaled_by_cross_validation(app, store):
    """A vecchia run's intervals carry a cross-validated latent scale: its metrics before that scale appear in the
    "Without recalibration" table, and the caption says how each listed run was calibrated."""
    from app.state import DatasetSpec
    from gpcore.run.pipeline import execute_run

    cfg = DatasetSpec().run_config(model="vecchia", settings={"epochs": 2}, seed=0, grid_cell_km=4.0,
                                   label="vecchia tiny")
    execute_run(cfg, store / "20240101-000002-000-vecchia")
    app.run()
    open_page(app, "compare").run()
    no_exceptions(app)
    caption = next(c.value for c in app.caption if "here the same test rows before that" in c.value)
    assert "variances rescaled on the validation split" in caption  # the dbk runs (per stratum)
    assert "vecchia" in caption and "latent variance scaled by cross-validation over the labelled rows" in caption
    skewed, counts = caption.split("; ")[-3:-1]  # a vecchia run's default: the skewed noise, and before it the Gaussian
    assert skewed.endswith(": with the skewed noise fitted there (here Gaussian)")
    assert "vecchia" in skewed and "dbk-rbf" not in skewed
    # ... and, weighted by tests as the Data page sets it, its noise scale per tests count, left out before
    assert counts.endswith(": and its noise scaled per tests count (here not) (the tables above)")
    assert "vecchia" in counts and "dbk-rbf" not in counts
    before = app.dataframe[2].value
    assert before["model"].str.startswith("vecchia").any() and before["group"].str.endswith(" (no recalibration)").all()


def test_export_page_offers_every_download(app, store):
    app.run()
    open_page(app, "export").run()
    no_exceptions(app)
    labels = {b.proto.label for b in app.get("download_button")}
    assert {"GeoTIFF", "GeoJSON", "CSV", "Run manifest (run.json)"} <= labels
    assert any(label.startswith("Model") for label in labels)
