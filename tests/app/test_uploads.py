"""Uploads never guess wrong: text in the target, unrecognised or swapped coordinates are fixed on the page.

Driven by widget interactions (upload, select, click) and checked by what the page shows.
"""

from __future__ import annotations

import pytest
from streamlit.testing.v1 import AppTest

from tests.sample_files import NO_COORD_NAMES, housing_with_text, swapped_lon_lat


def by_label(widgets, label: str):
    hits = [w for w in widgets if w.label == label]
    assert hits, f"no widget labelled {label!r}; labels: {[w.label for w in widgets]}"
    return hits[0]


def upload(app: AppTest, name: str, data: bytes) -> AppTest:
    app.run()
    app.radio(key="w_src_kind").set_value("Upload a file").run()
    app.file_uploader(key="w_upload").upload(name, data, "text/csv").run()
    assert not app.exception, [e.value for e in app.exception]
    return app


def sidebar_text(app: AppTest) -> str:
    return "\n".join(m.value for m in app.sidebar.markdown)


def test_text_in_the_target_keeps_it_a_target_and_names_the_rows_to_drop(app, store):
    upload(app, "housing.csv", housing_with_text())
    target = by_label(app.selectbox, "Target column")
    assert "median_house_value" in target.options
    assert target.value == "housing_median_age", "the first number column that is not a coordinate"
    assert "longitude" not in target.options and "latitude" not in target.options
    target.set_value("median_house_value").run()
    warnings = [w.value for w in app.warning]
    assert any("3 rows of 'median_house_value' will be dropped" in w and "'expensive'" in w and "'500k+'" in w
               and "101" in w and "1501" in w for w in warnings), warnings
    assert by_label(app.selectbox, "Target transform").value == "log10"
    strata_col = [r for r in app.radio if r.label.startswith("Strata")][0]
    strata_col.set_value("column").run()
    assert "lon" not in by_label(app.selectbox, "Strata column").options, "internal columns are not strata"
    strata_col.set_value("none").run()
    app.button(key="w_load_data").click().run()
    assert not app.exception
    assert "housing.csv" in sidebar_text(app) and "median_house_value" in sidebar_text(app)
    assert any(m.label == "Rows dropped" and m.value == "3" for m in app.metric)


def test_unrecognised_coordinates_are_chosen_on_the_page(app, store):
    upload(app, "no_names.csv", NO_COORD_NAMES)
    errors = [e.value for e in app.error]
    assert any("no_names.csv" in e and "Longitude column" in e for e in errors), errors
    assert not any("pass lon=" in e for e in errors), "CLI wording on the page"
    assert app.button(key="w_load_data").disabled
    by_label(app.selectbox, "Longitude column").set_value("px").run()
    by_label(app.selectbox, "Latitude column").set_value("py").run()
    assert not app.error, [e.value for e in app.error]
    assert by_label(app.selectbox, "Target column").value == "speed"
    app.button(key="w_load_data").click().run()
    assert "no_names.csv" in sidebar_text(app)


def test_swapped_coordinates_are_swapped_on_the_page(app, store):
    upload(app, "swapped.csv", swapped_lon_lat())
    errors = [e.value for e in app.error]
    assert any("swap them: choose 'lat' as Longitude column and 'lon' as Latitude column below" in e
               for e in errors), errors
    by_label(app.selectbox, "Longitude column").set_value("lat").run()
    by_label(app.selectbox, "Latitude column").set_value("lon").run()
    assert not app.error, [e.value for e in app.error]
    app.button(key="w_load_data").click().run()
    assert "swapped.csv" in sidebar_text(app)


@pytest.mark.parametrize("data", [NO_COORD_NAMES, swapped_lon_lat()])
def test_page_messages_never_give_cli_advice(data):
    from app.messages import for_page
    from gpcore import data as D
    from gpcore.errors import DataError

    with pytest.raises(DataError) as err:
        D.read_measurements(data, name="f.csv")
    cli = str(err.value)
    assert "pass lon=" in cli, "the reader words its fix for the API / CLI"
    page = for_page(cli)
    assert "pass lon" not in page and "lon=" not in page and "Longitude column" in page
