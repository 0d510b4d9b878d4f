"""The server settings the dashboard needs, enforced wherever ``streamlit run`` was started from.

Streamlit reads ``.streamlit/config.toml`` only from the working folder (and ``~/.streamlit``), so
``streamlit run /path/to/app/main.py`` started elsewhere would listen on every interface, keep XSRF
protection at its default and send full tracebacks (with server paths) to browsers. On every script
run :func:`enforce` therefore

* sets ``client.showErrorDetails`` to ``"type"`` (browsers see the exception type only; the
  traceback goes to the server log) and caps ``server.maxUploadSize`` at the data layer's 200 MB;
* reports (and :func:`problems` lists) what cannot be changed once the server runs: listening on all
  interfaces when nobody asked for it (no ``--server.address`` given anywhere), XSRF protection off.
  The page then shows how to start the app properly and stops.

No page content is drawn while a problem remains. ``scripts/run_app.sh`` passes these settings
explicitly, too.
"""

from __future__ import annotations

#: Largest upload in MB: gpcore.data.DEFAULT_MAX_BYTES (200 MB).
MAX_UPLOAD_MB = 200
SAFE_ERROR_DETAILS = "type"
START_HINT = (
    "start it with `bash scripts/run_app.sh`, or `streamlit run app/main.py` from the repository folder, "
    "or pass `--server.address 127.0.0.1` (or the address you mean to serve on) and keep XSRF protection on"
)


def problems() -> list[str]:
    """Server settings that make the dashboard unsafe and cannot be fixed at run time (empty: all good)."""
    from streamlit import config

    out = []
    address = config.get_option("server.address")
    if not address and config.get_where_defined("server.address") == "<default>":
        out.append("the server listens on all network interfaces (no server.address was set)")
    if not config.get_option("server.enableXsrfProtection"):
        out.append("XSRF protection is off (server.enableXsrfProtection = false)")
    return out


def apply_runtime_settings() -> None:
    """Settings that take effect at run time: no tracebacks to browsers, the upload limit."""
    from streamlit import config

    if config.get_option("client.showErrorDetails") not in (SAFE_ERROR_DETAILS, "none", False):
        config.set_option("client.showErrorDetails", SAFE_ERROR_DETAILS)
    if config.get_option("server.maxUploadSize") > MAX_UPLOAD_MB:
        config.set_option("server.maxUploadSize", MAX_UPLOAD_MB)


def enforce() -> None:
    """Apply the run-time settings; stop the page with instructions when the server itself is unsafe."""
    import streamlit as st

    apply_runtime_settings()
    found = problems()
    if found:
        st.error("The dashboard was started without its server settings: " + "; ".join(found) + ". " + START_HINT + ".")
        st.stop()
