"""The models package sits below everything that trains, runs or decides (issue 20): no module under
gpcore/models imports an upward module -- not at the top, not inside a function, not through its package."""

from __future__ import annotations

import ast
from pathlib import Path

MODELS = Path(__file__).resolve().parents[3] / "gpcore" / "models"
#: modules above the models: the joint posterior, distributed training, runs, the CLI, decisions, ...
UPWARD = ("gpcore.posterior", "gpcore.distributed", "gpcore.run", "gpcore.cli", "gpcore.cli_decide", "gpcore.decide",
          "app")


def imported_names(source: str, module: str) -> set[str]:
    """Every module ``source`` imports (absolute names; ``from pkg import sub`` counts as ``pkg.sub``)."""
    pkg = module.rsplit(".", 1)[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = pkg.split(".")[: len(pkg.split(".")) - node.level + 1]
                base = ".".join(up + ([base] if base else []))
            out.add(base)
            out.update(f"{base}.{a.name}" for a in node.names)
    return out


def upward_imports(source: str, module: str) -> set[str]:
    return {name for name in imported_names(source, module)
            if any(name == up or name.startswith(up + ".") for up in UPWARD)}


def test_the_check_sees_imports_inside_functions_and_through_packages():
    src = "def f():\n    from gpcore import distributed\n    import gpcore.run.pipeline\n"
    assert upward_imports(src, "gpcore.models.x") == {"gpcore.distributed", "gpcore.run.pipeline"}
    assert upward_imports("from .. import posterior\n", "gpcore.models.x") == {"gpcore.posterior"}
    assert upward_imports("from gpcore.models.linalg import LOG_2PI\nimport torch\n", "gpcore.models.x") == set()


def test_no_model_module_imports_upward():
    files = sorted(MODELS.rglob("*.py"))
    assert len(files) > 10
    found = {}
    for p in files:
        parts = p.relative_to(MODELS.parents[1]).with_suffix("").parts
        module = ".".join(parts)  # __init__ keeps its name: its package is gpcore.models
        bad = upward_imports(p.read_text(), module)
        if bad:
            found[str(p.relative_to(MODELS.parents[1]))] = sorted(bad)
    assert not found, found
