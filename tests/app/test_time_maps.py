"""Maps of a run with time as an input (issue 23 part 3): the quarter slider that every map kind follows, the Change
map with P(improved) from the joint posterior, the kernel slice at (x_ref, t_ref), the quarter in the URL; a run
without time keeps today's page. Every change goes through a widget (or a click on the grid-map component)."""

from __future__ import annotations

import numpy as np
import pandas as pd
from streamlit.testing.v1 import AppTest

from tests.app.conftest import PLAIN_RUN, TIME_RUN, click_grid, gridmaps, linked_page

QUARTERS = [f"{y}Q{q}" for y in (2019, 2020) for q in range(1, 5)]


def html_text(at: AppTest) -> str:
    return "\n".join(str(getattr(h.proto, "body", "")) for h in at.get("html"))


def sliders(at: AppTest) -> list:
    return list(at.get("select_slider"))


def test_the_quarter_slider_moves_every_map_kind(time_env):
    at = linked_page("maps", TIME_RUN)
    slider = at.select_slider(key="w_quarter")
    assert slider.options == QUARTERS and slider.value == "2020Q4", "a time run opens at its latest quarter"
    assert "Posterior mean of download_mbps at 2020Q4" in html_text(at)
    image_late = gridmaps(at)[f"pick_{TIME_RUN}"]["image"]

    slider.set_value("2019Q2").run()
    assert not at.exception, [e.value for e in at.exception]
    assert at.query_params["at"] == "2019Q2", "the URL keeps the quarter"
    assert "Posterior mean of download_mbps at 2019Q2" in html_text(at)
    assert gridmaps(at)[f"pick_{TIME_RUN}"]["image"] != image_late, "the map is the 2019Q2 grid, not the latest"
    lookup = gridmaps(at)[f"pick_{TIME_RUN}"]["lookup"]
    assert lookup["key"].endswith(":2019Q2"), "the tooltips carry the quarter's values"

    for kind, title in (("width", "95% prediction-interval width at 2019Q2"),
                        ("exceed", "P(download_mbps below 35 Mbps) at 2019Q2"),
                        ("data", "Measured download_mbps")):
        at.segmented_control(key="w_map_kind").set_value(kind).run()
        assert not at.exception, [e.value for e in at.exception]
        assert title in html_text(at), (kind, html_text(at))
        assert at.select_slider(key="w_quarter").value == "2019Q2", "the slider keeps its quarter across map kinds"
    assert "in 2019Q2 (" in html_text(at), "the measurement map shows the quarter's rows"


def test_a_run_without_time_has_no_slider_and_no_change_map(time_env):
    at = linked_page("maps", PLAIN_RUN)
    assert sliders(at) == [], "no quarter slider"
    assert "change" not in at.segmented_control(key="w_map_kind").options
    assert "at" not in at.query_params
    assert "Posterior mean of download_mbps (Mbps)" in html_text(at), "the legend names no quarter"


def test_the_change_map_gives_p_improved_from_the_joint_posterior(time_env):
    from gpcore.run.change import run_change

    at = linked_page("maps", TIME_RUN)
    at.segmented_control(key="w_map_kind").set_value("change").run()
    assert not at.exception, [e.value for e in at.exception]
    assert at.selectbox(key="w_change_from").value == "2019Q1" and at.selectbox(key="w_change_to").value == "2020Q4"
    at.selectbox(key="w_change_from").set_value("2019Q3").run()
    assert at.query_params["map"] == "change" and at.query_params["from"] == "2019Q3"
    text = html_text(at)
    assert "Change of download_mbps from 2019Q3 to 2020Q4" in text and "sign uncertain" in text
    maps = gridmaps(at)
    assert maps[f"pick_{TIME_RUN}"]["lookup"]["kind"] == "change"

    table = run_change(time_env / TIME_RUN, "2019Q3", "2020Q4").table
    i = int(np.argmin(np.abs(table["p_increase"] - 0.5)))  # the cell whose sign is least certain
    cell = table.iloc[i]
    click_grid(at, f"pick_{TIME_RUN}", i, float(cell.lon), float(cell.lat))
    assert not at.exception, [e.value for e in at.exception]
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["P(improved)"] == f"{cell.p_increase:.3f}", "the change posterior's P (the draws' mixture)"
    assert any("averaged over 16 draws of the hyperparameters" in c.value for c in at.caption)
    assert metrics["Change"] == f"{cell.change_mean:+.3f}"
    assert metrics["Change 95% interval"] == f"[{cell.change_lo:+.3f}, {cell.change_hi:+.3f}]"
    assert any(f"cell `{int(cell.cell_id)}`" in m.value for m in at.markdown)


def test_the_kernel_slice_of_a_time_run_is_at_x_ref_and_t_ref(time_env):
    at = linked_page("maps", TIME_RUN)
    grid = pd.read_parquet(time_env / TIME_RUN / "grid.parquet")
    i = len(grid) // 2
    click_grid(at, f"pick_{TIME_RUN}", i, float(grid.lon.iloc[i]), float(grid.lat.iloc[i]))
    assert not at.exception, [e.value for e in at.exception]
    assert any("Kernel slice at x_ref" in m.value for m in at.markdown)
    same = gridmaps(at)[f"slice_{TIME_RUN}"]["image"]
    assert "x_ref at 2020Q4, map at 2020Q4" in html_text(at)
    at.selectbox(key="w_slice_at").set_value("2019Q1").run()
    assert not at.exception, [e.value for e in at.exception]
    assert "x_ref at 2020Q4, map at 2019Q1" in html_text(at)
    assert gridmaps(at)[f"slice_{TIME_RUN}"]["image"] != same, "the slice decays over seven quarters"
    assert any("x_ref posterior at 2020Q4: mean" in c.value for c in at.caption)


def test_a_link_reopens_the_quarter_and_the_change(time_env):
    at = linked_page("maps", TIME_RUN, at="2019Q4", map="change", **{"from": "2019Q2", "to": "2020Q2"})
    assert at.select_slider(key="w_quarter").value == "2019Q4"
    assert at.selectbox(key="w_change_from").value == "2019Q2" and at.selectbox(key="w_change_to").value == "2020Q2"
    assert "Change of download_mbps from 2019Q2 to 2020Q2" in html_text(at)
    # a quarter the run has no grid for gives way to its latest
    at = linked_page("maps", TIME_RUN, at="2031Q1")
    assert at.select_slider(key="w_quarter").value == "2020Q4"


def test_change_colours_grey_out_cells_whose_sign_is_uncertain():
    from app.colors import CHANGE, N_COLORS, NEUTRAL, ColorScale, change_index, change_legend_html, lut, sign_uncertain

    p = np.array([0.02, 0.1, 0.5, 0.9, 0.97, 0.5])
    mean = np.array([-1.0, -0.4, 0.0, 0.4, 1.0, np.nan])
    assert sign_uncertain(p).tolist() == [False, False, True, False, False, True], "the band is open: 0.1 < P < 0.9"
    idx = change_index(mean, p, -1.0, 1.0)
    assert idx[2] == N_COLORS and tuple(lut(CHANGE)[N_COLORS]) == NEUTRAL, "uncertain -> the neutral grey"
    assert idx[5] == 0, "no value -> transparent"
    assert idx[0] == 1 and 1 < idx[1] < idx[3] < idx[4] < N_COLORS, "certain cells keep the diverging colours"
    html = change_legend_html(ColorScale("rdbu", -1.0, 1.0), "Change <x>")
    assert "Change &lt;x&gt;" in html and "sign uncertain: 0.1 &lt; P(improved) &lt; 0.9" in html

