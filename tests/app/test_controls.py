"""Every bound control keeps what the user picked (driven by widget interactions, never by session state).

Regression tests for the dashboard issue: the Map control sprang back to the mean map and the run
selectors to the newest run (``bind()`` copied the stored value over the user's pick), and the Train
page crashed for every model whose float settings got an int step.
"""

from __future__ import annotations

import pytest
from streamlit.testing.v1 import AppTest

from tests.app.conftest import open_page

RUNS = ("20240101-000001-000-dbk-silu", "20240101-000000-000-dbk-rbf")  # the test store's runs


def no_exceptions(at: AppTest) -> None:
    assert not at.exception, [e.value for e in at.exception]


def html_text(at: AppTest) -> str:
    return "\n".join(str(getattr(h.proto, "body", "")) for h in at.get("html"))


def headers(at: AppTest) -> list[str]:
    return [m.value for m in at.markdown if m.value.startswith("#### ")]


def maps(app: AppTest) -> AppTest:
    app.run()
    open_page(app, "maps").run()
    no_exceptions(app)
    return app


def test_map_control_shows_each_map_and_stays_there(app, store):
    maps(app)
    assert "Posterior mean of download_mbps" in html_text(app)
    app.segmented_control(key="w_map_kind").set_value("width").run()
    no_exceptions(app)
    assert "95% prediction-interval width" in html_text(app)
    assert app.segmented_control(key="w_map_kind").value == "width"
    app.selectbox(key="w_scale").set_value("magma").run()  # any later rerun keeps the pick
    assert app.segmented_control(key="w_map_kind").value == "width"
    assert "95% prediction-interval width" in html_text(app)
    assert app.query_params["map"] == ["width"] or app.query_params["map"] == "width"
    app.segmented_control(key="w_map_kind").set_value("data").run()
    no_exceptions(app)
    assert "Measured download_mbps" in html_text(app)
    assert app.segmented_control(key="w_map_kind").value == "data"


@pytest.mark.parametrize("where", ["maps", "decide", "export"])
def test_run_selectors_keep_the_chosen_run(app, store, where):
    """The sidebar's run picker (the only one) drives Maps, Decide and Export, whichever page it is used on."""
    maps(app)
    first = headers(app)
    older = next(r for r in RUNS if r != app.sidebar.selectbox(key="w_sidebar_run").value)  # a run not shown now
    if where != "maps":
        open_page(app, where).run()
    app.sidebar.selectbox(key="w_sidebar_run").set_value(older).run()
    no_exceptions(app)
    assert app.sidebar.selectbox(key="w_sidebar_run").value == older
    if where == "export":
        assert older in app.code[0].value or older in str(app.json[0].proto.body)
    if where == "decide":
        assert any(f"model `{older.split('-', 3)[-1]}`" in c.value for c in app.caption), "Decide shows the run"
    if where != "maps":
        open_page(app, "maps").run()
    no_exceptions(app)
    assert app.sidebar.selectbox(key="w_sidebar_run").value == older
    app.selectbox(key="w_scale").set_value("magma").run()  # a later rerun keeps it
    assert app.sidebar.selectbox(key="w_sidebar_run").value == older
    assert headers(app) != first, "the map header names the chosen run"
    assert app.query_params["run"] in (older, [older])


def test_one_run_picker(app, store):
    """Maps, Decide and Export draw no run selector of their own: the sidebar's is the one."""
    maps(app)
    for page in ("maps", "decide", "export"):
        open_page(app, page).run()
        no_exceptions(app)
        assert [s.label for s in app.selectbox if s.label in ("Run", "Active run")] == ["Active run"], page


def test_second_run_side_by_side_keeps_its_pick(app, store):
    maps(app)
    app.toggle(key="w_side").set_value(True).run()
    no_exceptions(app)
    from gpcore.run.store import RunStore

    taken = {app.sidebar.selectbox(key="w_sidebar_run").value, app.selectbox(key="w_maps_run2").value}
    pick = next(r.run_id for r in RunStore().list() if r.run_id not in taken)
    app.selectbox(key="w_maps_run2").set_value(pick).run()
    app.selectbox(key="w_scale").set_value("magma").run()
    assert app.selectbox(key="w_maps_run2").value == pick
    assert len(headers(app)) == 2
    app.toggle(key="w_side").set_value(False).run()
    assert len(headers(app)) == 1


def test_train_page_renders_every_registered_model(app, store):
    from gpcore.models import available_models

    app.run()
    open_page(app, "train").run()
    no_exceptions(app)
    for name in available_models():
        app.selectbox(key="w_model").set_value(name).run()
        no_exceptions(app)
        assert [b for b in app.button if b.key == "w_train"], f"no Train button for {name}"
        assert app.selectbox(key="w_model").value == name
        assert not any("paper defaults" in m.value for m in app.markdown)
        keys = {w.key for w in app.number_input}
        offered_batch = f"w_set_{name}_batch_size" in keys
        assert offered_batch == (name not in ("exact", "vecchia", "dbk-nn")), f"{name}: batch size offered only if read"


def test_two_runs_with_the_same_label_stay_apart_in_the_picker(app, store):
    """A selectbox tells options apart by their labels: two runs of one model made in the same minute with the same
    test NLL (an identical re-run) must not share one, or choosing the second selects the first."""
    import shutil

    from app import cache

    src = store / "20240101-000000-000-dbk-rbf"
    twin = store / "20240101-000000-001-dbk-rbf"
    shutil.copytree(src, twin)
    app.run()
    no_exceptions(app)
    box = app.sidebar.selectbox(key="w_sidebar_run")
    assert len(set(box.options)) == len(box.options), box.options
    for rid in (twin.name, src.name):
        app.sidebar.selectbox(key="w_sidebar_run").set_value(rid).run()
        no_exceptions(app)
        app.run()  # a later rerun keeps it
        assert app.sidebar.selectbox(key="w_sidebar_run").value == rid
    assert cache.unique_labels({"a": "x", "b": "x", "c": "y"}) == {"a": "x · a", "b": "x · b", "c": "y"}


def test_the_run_picker_shows_each_runs_test_nll_before_its_date(app, store):
    """The sidebar is narrow and cuts a long option's end: the label reads model, test NLL, then the date."""
    import re

    app.run()
    no_exceptions(app)
    options = app.sidebar.selectbox(key="w_sidebar_run").options
    label = re.compile(r"^[\w-]+ · NLL -?\d+\.\d{3} · \d{4}-\d\d-\d\d \d\d:\d\d")
    assert options and all(label.match(o) for o in options), options
