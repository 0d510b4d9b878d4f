"""The view state has one home: every ``ua_*`` session key and every bound widget key comes from
:class:`app.state.ViewState`; no other module under ``app/`` spells one, and ``app/`` never imports the CLI."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from app import state

APP_DIR = Path(__file__).resolve().parents[2] / "app"
#: String literals that start with ``ua_`` but are no session keys: the grid-map component's name (its iframe
#: title, which the browser tests and benchmarks/bench_browser.py find it by).
NOT_SESSION_KEYS = {("gridmap.py", "ua_gridmap")}


def view_state_bypasses(source: str, filename: str = "<source>") -> list[str]:
    """``ua_*`` string literals and attributes, and literal widget keys of view-state fields, in ``source``."""
    widget_keys = {f.metadata["widget"] for f in state.FIELDS.values()} - {None}
    found = []
    for node in ast.walk(ast.parse(source, filename)):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            if node.value.startswith(state.PREFIX) and (Path(filename).name, node.value) not in NOT_SESSION_KEYS:
                found.append(f"{filename}:{node.lineno}: session key literal {node.value!r}")
            elif node.value in widget_keys:
                found.append(f"{filename}:{node.lineno}: widget key literal {node.value!r} (use state.control)")
        elif isinstance(node, ast.Attribute) and node.attr.startswith(state.PREFIX):
            found.append(f"{filename}:{node.lineno}: session key attribute .{node.attr}")
    return found


def app_sources():
    for path in sorted(APP_DIR.rglob("*.py")):
        if path != APP_DIR / "state.py":
            yield path, path.read_text()


def test_no_module_but_state_spells_a_session_key():
    found = [hit for path, src in app_sources() for hit in view_state_bypasses(src, str(path.relative_to(APP_DIR)))]
    assert not found, "\n".join(found)


def test_the_scan_finds_each_kind_of_bypass():
    src = ('ss = st.session_state\nss["ua_run"] = 1\nss.ua_map = "width"\nst.selectbox("Colour scale", [], '
           'key="w_scale")\nx = f"ua_{1}"\n')
    found = view_state_bypasses(src)
    assert len(found) == 4, found
    assert view_state_bypasses('components.declare_component("ua_gridmap")', "gridmap.py") == []


def test_app_never_imports_the_cli():
    for path, src in app_sources():
        for node in ast.walk(ast.parse(src)):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            assert not any(n == "gpcore.cli" or n.startswith("gpcore.cli.") for n in names), path


def test_fields_have_distinct_widget_keys_and_defaults_within_their_choices():
    widget_keys = [f.metadata["widget"] for f in state.FIELDS.values() if f.metadata["widget"]]
    assert len(widget_keys) == len(set(widget_keys))
    for name, f in state.FIELDS.items():
        choices = f.metadata["choices"]
        assert choices is None or f.default in choices, name
        assert state.session_key(name) == "ua_" + name


def test_update_refuses_unknown_fields_and_values_outside_the_choices():
    with pytest.raises(KeyError, match="not a view-state field"):
        state.update(runn="x")
    with pytest.raises(ValueError, match="allowed: mean, width, data, exceed"):
        state.update(map="median")
    with pytest.raises(KeyError):
        state.widget_key("xref")  # a click on the map sets it, no widget


def test_no_file_under_app_passes_500_lines():
    lines = {str(p.relative_to(APP_DIR)): len(p.read_text().splitlines()) for p in APP_DIR.rglob("*.py")}
    long = {name: n for name, n in lines.items() if n > 500}
    assert not long, long
