"""Hostile user strings never reach the browser as markup (issue 12, item 1): one escaping helper
(:mod:`app.safe_html`) is used wherever column names, file names, stratum values and run labels are shown."""

from __future__ import annotations

import json
import re
import shutil

import numpy as np
import pandas as pd
from streamlit.testing.v1 import AppTest

from app.safe_html import html_text, md_code, md_text
from tests.app.conftest import APP, TIMEOUT, open_page

XSS = "<img src=x onerror=alert(1)>"
MD_LINK = "![t](http://evil.example/x.png)"


def test_html_text_escapes_tags_and_quotes():
    assert html_text(XSS) == "&lt;img src=x onerror=alert(1)&gt;"
    assert html_text('a"b\'c&') == "a&quot;b&#x27;c&amp;"


def test_md_text_neutralises_links_images_directives_and_html():
    out = md_text(f"{MD_LINK} :red[x] `c` {XSS}\nnext")
    for raw in ("![t](", ":red[", "`c`"):
        assert raw not in out
    assert re.search(r"(?<!\\)<img", out) is None and "\\<img" in out
    assert "\n" not in out
    assert md_text("download_mbps") == "download_mbps", "ordinary names stay readable"


def test_md_code_holds_backticks():
    assert md_code("a`b") == "``a`b``"
    assert md_code("plain") == "`plain`"


def _markup(at: AppTest) -> tuple[list[str], list[str]]:
    """``(markdown, html)``: every string this script run sends that the browser renders as markdown, and
    every one it renders as HTML (st.html, deck.gl tooltips, plotly trace names)."""
    md = []
    for kind in ("markdown", "caption", "error", "warning", "info", "success", "subheader", "title"):
        md += [e.value for e in at.get(kind)]
    html = [e.proto.body for e in at.get("html")]
    html += [e.proto.tooltip for e in at.get("deck_gl_json_chart")]
    html += [json.dumps([t.get("name") for t in json.loads(c.proto.spec)["data"]]) for c in at.get("plotly_chart")]
    return md, html


def _assert_clean(at: AppTest, where: str) -> int:
    assert not at.exception, (where, [e.value for e in at.exception])
    md, html = _markup(at)
    for text in md:
        text = re.sub(r"(`+)(.+?)\1", "<code span>", text)  # a code span shows its content as literal text
        assert XSS not in text and MD_LINK not in text, (where, text[:300])
    for text in html:
        assert "<img" not in text, (where, text[:300])
    return len(md) + len(html)


def test_hostile_column_file_and_stratum_names_are_escaped_everywhere(app, store):
    rng = np.random.default_rng(0)
    n = 80
    df = pd.DataFrame({
        "lon": rng.uniform(-66.9, -65.7, n).round(5), "lat": rng.uniform(18.05, 18.45, n).round(5),
        XSS: rng.uniform(5, 200, n).round(2),
        "zone": np.where(np.arange(n) % 2 == 0, XSS, MD_LINK),
    })
    app.run()
    app.radio(key="w_src_kind").set_value("Upload a file").run()
    app.file_uploader(key="w_upload").upload("speeds.csv", df.to_csv(index=False).encode(), "text/csv").run()
    _assert_clean(app, "upload")
    # choose the hostile column as the target and the hostile zones as strata, as a user does
    next(s for s in app.selectbox if s.label == "Target column").set_value(XSS).run()
    next(r for r in app.radio if r.label.startswith("Strata")).set_value("column").run()
    next(s for s in app.selectbox if s.label == "Strata column").set_value("zone").run()
    app.button(key="w_load_data").click().run()
    assert app.session_state["ua_dataset"].y == XSS, [e.value for e in app.error]
    _assert_clean(app, "data page")
    decks = app.get("deck_gl_json_chart")
    assert decks and any("&lt;img" in d.proto.tooltip for d in decks), "the column name is shown, escaped"
    assert any("&lt;img" in h.proto.body for h in app.get("html")), "the legend shows it, escaped"
    for page in ("train", "maps", "decide", "compare",
                 "export"):
        open_page(app, page).run()
        _assert_clean(app, page)


def test_hostile_run_labels_and_strata_are_escaped(app, store):
    src = next(p for p in sorted(store.iterdir()) if (p / "run.json").is_file())
    bad = store / "20990101-000000-000-dbk-rbf"
    shutil.copytree(src, bad)
    m = json.loads((bad / "run.json").read_text())
    m["label"] = XSS
    m["created"] = "2099-01-01T00:00:00+00:00"
    (bad / "run.json").write_text(json.dumps(m))
    t = pd.read_parquet(bad / "test_predictions.parquet")
    t["stratum"] = np.where(np.arange(len(t)) % 2 == 0, XSS, MD_LINK)
    t.to_parquet(bad / "test_predictions.parquet", index=False)
    at = AppTest.from_file(APP, default_timeout=TIMEOUT)
    at.query_params["run"] = bad.name
    at.run()
    _assert_clean(at, "sidebar")
    for page in ("maps", "decide", "compare", "export"):
        open_page(at, page).run()
        _assert_clean(at, page)
    open_page(at, "maps").run()
    assert any("\\<img" in m.value for m in at.markdown), "the run's label is shown as text"
    open_page(at, "compare").run()
    names = [t.get("name") for c in at.get("plotly_chart") for t in json.loads(c.proto.spec)["data"]]
    assert html_text(XSS) in names, names
