"""The dashboard's pages: each page module's ``render(data, runs)``, registered with ``st.navigation``.

A page is a function of the active data set (:class:`app.cache.LoadedData`) and the run list the
sidebar read from the store; the view state (:mod:`app.state`) holds what the user chose.
"""

from __future__ import annotations

from functools import partial

import streamlit as st

#: ``(url path, title, icon, page module)`` in the order of the sidebar's navigation.
PAGES = (
    ("data", "Data", ":material/database:", "data"),
    ("train", "Train", ":material/model_training:", "train"),
    ("maps", "Maps", ":material/map:", "maps"),
    ("compare", "Compare", ":material/leaderboard:", "compare"),
    ("decide", "Decide", ":material/rule:", "decide"),
    ("export", "Export", ":material/download:", "export"),
)


def pages(data, runs) -> list:
    """One ``st.Page`` per page, drawing ``render(data, runs)``; the first is the default."""
    from importlib import import_module

    return [
        st.Page(partial(import_module(f"app.app_pages.{module}").render, data, runs), title=title, icon=icon,
                url_path=path, default=i == 0)
        for i, (path, title, icon, module) in enumerate(PAGES)
    ]


def link(path: str, label: str, icon: str) -> None:
    """A link to the page at ``path`` (pages are callables: ``st.page_link`` takes the page, not a file)."""
    title = next(t for p, t, _, _ in PAGES if p == path)
    st.page_link(st.Page(_unreachable, title=title, url_path=path), label=label, icon=icon)


def _unreachable() -> None:  # a link's page is matched by its url path; navigation runs the registered one
    raise RuntimeError("a page link's placeholder page was run")
