"""URL parameters name bundled samples and uploads only; the server settings hold wherever the app starts;
uploads are a bounded cache (issue 12, items 3, 5, 13)."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from streamlit.testing.v1 import AppTest

from tests.app.conftest import APP, TIMEOUT


@pytest.fixture
def secret_polygons(tmp_path) -> Path:
    """A valid polygon layer outside the uploads folder: a URL must not be able to load it."""
    path = tmp_path / "server-secret.geojson"
    ring = [[-67.5, 17.8], [-65.2, 17.8], [-65.2, 18.6], [-67.5, 18.6], [-67.5, 17.8]]
    path.write_text(json.dumps({"type": "FeatureCollection", "features": [
        {"type": "Feature", "properties": {}, "geometry": {"type": "Polygon", "coordinates": [ring]}}]}))
    return path


@pytest.mark.parametrize("params", [
    {"strata": "polygons:{secret}"},
    {"strata": "polygons:file:{secret}"},
    {"strata": "polygons:../../{secret}"},
    {"data": "file:{secret}"},
    {"data": "{secret}"},
    {"data": "upload:../../etc/passwd"},
    {"strata": "polygons:/no/such/file.geojson"},
])
def test_url_parameters_never_name_server_files(store, secret_polygons, params, monkeypatch):
    import gpcore.data as D

    opened = []
    real = D.read_polygons
    monkeypatch.setattr(D, "read_polygons", lambda src, *a, **k: opened.append(str(src)) or real(src, *a, **k))
    at = AppTest.from_file(APP, default_timeout=TIMEOUT)
    at.query_params.update({"data": "sample:puerto_rico", "quarter": "2023", "y": "download_mbps"})
    at.query_params.update({k: v.format(secret=secret_polygons) for k, v in params.items()})
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    spec = at.session_state["ua_dataset"]
    assert str(secret_polygons) not in str(spec) and "file:" not in str(spec)
    assert spec.source == "sample:puerto_rico" and spec.strata == "county_metro", "the default view instead"
    assert not opened, "no polygon file was read for the URL"
    errors = " ".join(e.value for e in at.error)
    assert "not allowed" in errors, errors
    assert str(Path.cwd()) not in errors, "no server folder is revealed"


def test_the_url_policy_accepts_what_links_may_name():
    from app.state import check_url_reference
    from gpcore.errors import DataError

    for param, value in (("data", "sample:puerto_rico"), ("data", "upload:0123456789abcdef/speeds.csv"),
                         ("strata", "county_metro"), ("strata", "column:zone"),
                         ("strata", "polygons:upload:0123456789abcdef/zones.geojson")):
        check_url_reference(param, value)
    for param, value in (("data", "sample:../../x"), ("data", "/etc/passwd"), ("strata", "polygons:/etc/passwd"),
                         ("strata", "polygons:upload:0123456789abcdef/../x"), ("strata", "anything")):
        with pytest.raises(DataError):
            check_url_reference(param, value)


def test_an_uploaded_polygon_layer_in_the_url_still_works(store, secret_polygons):
    from app.uploads import save_upload

    ref = save_upload("zones.geojson", secret_polygons.read_bytes())
    at = AppTest.from_file(APP, default_timeout=TIMEOUT)
    at.query_params.update({"data": "sample:puerto_rico", "quarter": "2023", "y": "download_mbps",
                            "strata": f"polygons:{ref}"})
    at.run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    assert at.session_state["ua_dataset"].strata == f"polygons:{ref}"


# ------------------------------------------------------------------------------------------ server settings


def test_runtime_settings_hide_tracebacks_and_cap_uploads():
    from streamlit import config

    from app import server_settings as S

    before = {k: config.get_option(k) for k in ("client.showErrorDetails", "server.maxUploadSize")}
    try:
        config.set_option("client.showErrorDetails", "full")
        config.set_option("server.maxUploadSize", 5000)
        S.apply_runtime_settings()
        assert config.get_option("client.showErrorDetails") == "type"
        assert config.get_option("server.maxUploadSize") == 200
    finally:
        for k, v in before.items():
            config.set_option(k, v)


def test_an_unsafe_server_is_detected(monkeypatch):
    from streamlit import config

    from app import server_settings as S

    values = {"server.address": None, "server.enableXsrfProtection": False}
    monkeypatch.setattr(config, "get_option", lambda k: values[k])
    monkeypatch.setattr(config, "get_where_defined", lambda k: "<default>")
    found = S.problems()
    assert any("all network interfaces" in p for p in found) and any("XSRF" in p for p in found)
    values.update({"server.address": "0.0.0.0", "server.enableXsrfProtection": True})
    monkeypatch.setattr(config, "get_where_defined", lambda k: "command-line argument or environment variable")
    assert S.problems() == [], "an address someone chose is respected"


def test_the_app_refuses_to_serve_on_an_unsafe_server(store, monkeypatch):
    from app import server_settings as S

    monkeypatch.setattr(S, "problems", lambda: ["the server listens on all network interfaces"])
    at = AppTest.from_file(APP, default_timeout=TIMEOUT)
    at.run()
    assert not at.exception
    assert any("started without its server settings" in e.value for e in at.error)
    assert not at.sidebar.markdown, "nothing else is drawn"


def test_the_project_config_sets_the_safe_values():
    import tomllib

    cfg = tomllib.loads((Path(__file__).resolve().parents[2] / ".streamlit" / "config.toml").read_text())
    assert cfg["server"]["address"] == "127.0.0.1" and cfg["server"]["enableXsrfProtection"] is True
    assert cfg["client"]["showErrorDetails"] in ("type", "none")


# ------------------------------------------------------------------------------------------ uploads


def test_a_very_long_upload_name_is_shortened(app, store):
    rows = pd.DataFrame({"lon": [-66.5 + 0.01 * i for i in range(30)], "lat": [18.2] * 30,
                         "mbps": [10.0 + i for i in range(30)]})
    name = "x" * 300 + ".csv"
    app.run()
    app.radio(key="w_src_kind").set_value("Upload a file").run()
    app.file_uploader(key="w_upload").upload(name, rows.to_csv(index=False).encode(), "text/csv").run()
    assert not app.exception, [e.value for e in app.exception]
    assert not app.error, [e.value for e in app.error]
    stored = [p for p in (store / "_uploads").rglob("*.csv")]
    assert stored and all(len(p.name) <= 120 and p.name.endswith(".csv") for p in stored)


def test_an_unusable_upload_is_not_kept(app, store):
    app.run()
    app.radio(key="w_src_kind").set_value("Upload a file").run()
    app.file_uploader(key="w_upload").upload("bad.csv", bytes(range(256)) * 64, "text/csv").run()
    assert any("bad.csv" in e.value for e in app.error)
    assert not list((store / "_uploads").rglob("bad.csv")), "a file that cannot be read at all is removed"


def test_the_upload_cache_is_capped(store):
    import os
    import time

    from app import uploads

    refs = [uploads.save_upload(f"f{i}.csv", os.urandom(400_000)) for i in range(5)]
    for i, ref in enumerate(refs):  # oldest first
        folder = uploads.resolve_upload(ref).parent
        os.utime(folder, (time.time() - 100 + i, time.time() - 100 + i))
    removed = uploads.prune_uploads(cap_mb=1.0)
    assert len(removed) == 3
    kept = [r for r in refs if (uploads.uploads_dir() / r.split(":")[1].split("/")[0]).is_dir()]
    assert kept == refs[-2:], "the least recently used go first"
