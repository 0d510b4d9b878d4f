"""Uncertainty Atlas dashboard: ``streamlit run app/main.py``.

A thin multipage Streamlit layer over :mod:`gpcore`. The sidebar shows the active data set, the runs
trained so far (with the one run picker) and the device in use; each page in ``app/app_pages/`` is a
function of that data set and run list (:mod:`app.navigation`). Data set, run, map and the
kernel-slice reference point live in the URL, so a copied link reopens the same view (:mod:`app.state`).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

_T0 = time.perf_counter()

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # `streamlit run app/main.py` puts app/ on the path, not the repository
    sys.path.insert(0, str(ROOT))

import streamlit as st  # noqa: E402

from app import navigation, server_settings, state  # noqa: E402
from app.jobs import configure_torch_threads  # noqa: E402
from app.safe_html import md_text  # noqa: E402
from app.sidebar import active_data, render_sidebar  # noqa: E402
from gpcore.errors import GPCoreError  # noqa: E402

ASSETS = ROOT / "assets"

st.set_page_config(page_title="Uncertainty Atlas", page_icon=str(ASSETS / "logo.svg"), layout="wide")
server_settings.enforce()  # no tracebacks to browsers; refuse to serve on an unsafe server (see its docstring)
css = ASSETS / "style.css"
if css.is_file():
    st.html(f"<style>{css.read_text()}</style>")

configure_torch_threads()
state.init_session()
data = active_data()
runs = render_sidebar(data)
page = st.navigation(navigation.pages(data, runs))
state.on_page(page.url_path)
try:
    page.run()
except GPCoreError as exc:  # a damaged run or file: say which, keep the sidebar (pick another run)
    st.error(f"This page cannot be shown: {md_text(exc)}")
finally:  # also after st.stop() on a page
    state.sync_query()
    # server time of this script run (read by benchmarks/bench_app.py)
    state.update(script_ms=1000 * (time.perf_counter() - _T0))
