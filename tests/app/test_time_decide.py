"""Decide at a quarter and the forecast split on Compare, for runs with time as an input (issue 23 part 3).

The Decide page of a space-time run draws the Maps page's quarter slider and evaluates exceedance, area posteriors,
plausible maps and suggestions at that quarter's decimal year (a d = 3 model failed with "X has 2 column(s)" before);
Compare puts the forecast split beside random. Widgets only: nothing writes session state.
"""

from __future__ import annotations

import numpy as np
import pytest
from streamlit.testing.v1 import AppTest

from tests.app.conftest import APP, FORECAST_RUN, PLAIN_RUN, TIME_RUN, TIMEOUT, gridmaps, linked_page, open_page


def area_table(at: AppTest):
    return next(d.value for d in at.dataframe if "P(below)" in d.value.columns)


def test_decide_at_the_sliders_quarter(time_env, monkeypatch):
    import gpcore.models.vecchia_joint as VJ
    from gpcore.run import decisions

    with monkeypatch.context() as m:  # at the grid's quarter the fit's stored factor serves: nothing is rebuilt
        m.setattr(VJ, "build_joint", lambda *a, **k: (_ for _ in ()).throw(AssertionError("factor rebuilt")))
        at = linked_page("decide", TIME_RUN, at="2020Q4")
        assert not at.exception, [e.value for e in at.exception]
    slider = at.select_slider(key="w_quarter")
    assert slider.value == "2020Q4"
    heads = [h.value for h in at.subheader]
    assert "Areas at 2020Q4" in heads and "Plausible maps at 2020Q4" in heads
    late = area_table(at)
    exceed_late = gridmaps(at)[f"exceed_{TIME_RUN}"]["image"]

    slider.set_value("2019Q1").run()
    assert not at.exception, [e.value for e in at.exception]
    assert at.query_params["at"] == "2019Q1"
    assert "Areas at 2019Q1" in [h.value for h in at.subheader]
    early = area_table(at)
    assert gridmaps(at)[f"exceed_{TIME_RUN}"]["image"] != exceed_late, "P(below) follows the quarter"
    # the areas' posteriors are gpcore's at 2019Q1's decimal year (lon, lat, t), not those of the latest quarter
    run = decisions.open_run(time_env / TIME_RUN, at="2019Q1")
    labels, _ = decisions.area_labels(run.grid, "counties", state=run.state, strata=run.strata)
    want = decisions.area_table(run.model, run.grid, labels, threshold=35.0, units="original",
                                transform=run.transform, t=run.t).set_index("area")
    got = early.set_index("area")
    assert run.t == pytest.approx(2019.125)
    np.testing.assert_allclose(got["P(below)"], want.loc[got.index, "p_below"], atol=1e-9)
    assert not np.allclose(got["P(below)"], late.set_index("area").loc[got.index, "P(below)"]), \
        "the speeds rose over the quarters: the areas differ"

    # where to measure next works on the d = 3 model too
    at.button(key="w_decide_suggest").click().run()
    assert not at.exception, [e.value for e in at.exception]
    assert any(f"suggest_{TIME_RUN}" == k for k in gridmaps(at))


def test_decide_on_a_run_without_time_has_no_slider(time_env):
    at = linked_page("decide", PLAIN_RUN)
    assert list(at.get("select_slider")) == []
    assert "Areas" in [h.value for h in at.subheader]


def test_compare_offers_the_forecast_split_beside_random(time_env):
    at = AppTest.from_file(APP, default_timeout=TIMEOUT)
    at.run()
    open_page(at, "compare").run()
    at.toggle(key="w_cmp_all").set_value(True).run()  # the runs are on a CSV, not the active sample
    assert not at.exception, [e.value for e in at.exception]
    control = at.segmented_control(key="w_cmp_split")
    assert control.options == ["Random", "Forecast (2020Q4)"]
    control.set_value("forecast:2020Q4").run()
    assert not at.exception, [e.value for e in at.exception]
    ranking = at.dataframe[0].value
    assert set(ranking["split"]) == {"Forecast (2020Q4)"} and len(ranking) == 1
    assert FORECAST_RUN in " ".join(ranking["run"]) or "vecchia forecast tiny" in " ".join(ranking["run"])
    assert any("Test split: **forecast**" in m.value for m in at.markdown)


def test_the_quarter_survives_every_page_switch(time_env):
    """The slider is one view-state value drawn by three pages, and Streamlit gives each page's widget its own
    identity: after Decide -> Maps the Maps slider showed 2019Q1 (its first option), not the quarter chosen on Decide.
    Each switch keeps the quarter, in the slider and the URL."""
    at = linked_page("decide", TIME_RUN)
    expected = "2019Q2"
    at.select_slider(key="w_quarter").set_value(expected).run()
    for path, move_to in (("maps", "2020Q1"), ("export", "2019Q4"), ("decide", "2020Q2"), ("maps", None)):
        open_page(at, path).run()
        assert not at.exception, [e.value for e in at.exception]
        assert (at.select_slider(key="w_quarter").value, at.query_params["at"]) == (expected, expected), path
        if move_to:
            at.select_slider(key="w_quarter").set_value(move_to).run()
            expected = move_to
