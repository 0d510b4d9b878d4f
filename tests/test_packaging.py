"""The library installs and imports without the dashboard's packages (issue 20, part 5).

`pip install .` must give a working `gpcore` without Streamlit, pydeck or plotly: those live in the `app`
extra, and no module under gpcore/ may import them.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: pytest depends on tomli there
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
APP_ONLY = {"streamlit", "pydeck", "plotly"}


def _name(requirement: str) -> str:
    """The distribution name of a PEP 508 requirement, normalised ('Plotly>=5' -> 'plotly')."""
    return re.split(r"[\s<>=!~;\[(]", requirement.strip(), maxsplit=1)[0].lower().replace("_", "-")


def _project() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]


def _top_level_imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


def test_core_dependencies_exclude_the_dashboard():
    core = {_name(r) for r in _project()["dependencies"]}
    assert not core & APP_ONLY, f"core dependencies include app-only packages: {sorted(core & APP_ONLY)}"
    assert "torch" in core


def test_app_extra_holds_the_dashboard_packages():
    app = {_name(r) for r in _project()["optional-dependencies"]["app"]}
    assert APP_ONLY <= app, f"the app extra lacks {sorted(APP_ONLY - app)}"


def test_torch_floor_is_kept():
    torch = [r for r in _project()["dependencies"] if _name(r) == "torch"]
    assert torch == ["torch>=2.3"]


def test_no_gpcore_module_imports_the_dashboard_packages():
    files = sorted((ROOT / "gpcore").rglob("*.py"))
    assert files, "no modules found under gpcore/"
    offenders = {
        str(f.relative_to(ROOT)): sorted(_top_level_imports(f) & APP_ONLY)
        for f in files
        if _top_level_imports(f) & APP_ONLY
    }
    assert not offenders, f"gpcore modules import app-only packages: {offenders}"


def test_import_scan_sees_nested_and_from_imports(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("def f():\n    import plotly.express as px\n    from streamlit import session_state\n")
    assert _top_level_imports(module) >= {"plotly", "streamlit"}
