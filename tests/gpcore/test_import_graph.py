"""gpcore's modules import each other without cycles (issue 12): every import statement, including the
ones inside functions, counts. A run folder's format lives in gpcore/run/rundir.py alone (the only code that
names run.json), the run store sits on it, the CLI sits on top and the dashboard imports nothing from the CLI
(issue 20)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PKG = ROOT / "gpcore"
APP = ROOT / "app"


def import_graph() -> dict[str, set[str]]:
    mods = {}
    for p in PKG.rglob("*.py"):
        parts = p.relative_to(PKG.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        mods[name] = p
    edges: dict[str, set[str]] = {m: set() for m in mods}
    for m, p in mods.items():
        pkg = m if p.name == "__init__.py" else m.rsplit(".", 1)[0]
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = pkg.split(".")[: len(pkg.split(".")) - node.level + 1]
                    base = ".".join(up + ([base] if base else []))
                # `from pkg import sub` depends on the submodule; `from mod import name` on the module
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in node.names]
            else:
                continue
            for t in targets:
                while t and t not in mods:
                    t = t.rsplit(".", 1)[0] if "." in t else ""
                if t and t != m:
                    edges[m].add(t)
    return edges


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def test_cycle_finder_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_gpcore_has_no_import_cycles():
    edges = import_graph()
    found = cycles(edges)
    assert not found, {m: sorted(edges[m] & set(c)) for c in found for m in c}


def test_the_run_package_is_layered_and_the_cli_is_on_top():
    edges = import_graph()
    cli = {"gpcore.cli", "gpcore.cli_decide"}
    assert not any(cli & deps for m, deps in edges.items() if m not in cli | {"gpcore.__main__"})
    run = {m for m in edges if m.startswith("gpcore.run.")}
    assert run >= {"gpcore.run.rundir", "gpcore.run.pipeline", "gpcore.run.store", "gpcore.run.predict",
                   "gpcore.run.decisions", "gpcore.run.compare", "gpcore.run.sharded"}
    assert edges["gpcore.run.rundir"] & run == {"gpcore.run.config"}  # the format knows only the settings
    assert "gpcore.run.pipeline" not in edges["gpcore.run.store"]  # the store sits on the format, not the pipeline
    assert not edges["gpcore.run.predict"] & {"gpcore.run.pipeline", "gpcore.run.decisions"}
    for low in ("gpcore.distributed", "gpcore.data.grid", "gpcore.data.export", "gpcore.decide"):
        assert not edges[low] & (run | cli), low
    for old in ("gpcore.runs", "gpcore.store", "gpcore.predict_stream", "gpcore.compare", "gpcore.sharded"):
        assert old not in edges  # moved under gpcore/run/, no shims


def imports_of(path: Path) -> set[str]:
    """Every module an app or gpcore file imports (``from a import b`` counts as ``a`` and ``a.b``)."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            out |= {node.module} | {f"{node.module}.{a.name}" for a in node.names}
    return out


def cli_importers(root: Path) -> list[str]:
    """Files under ``root`` that import ``gpcore.cli`` (or ``gpcore.cli_decide``)."""
    return sorted(str(p.relative_to(root)) for p in root.rglob("*.py")
                  if any(m == "gpcore.cli" or m.startswith(("gpcore.cli.", "gpcore.cli_")) for m in imports_of(p)))


def manifest_namers(*roots: Path) -> list[str]:
    """Files that name a run's manifest: a text constant that is the file name ``run.json`` (or a path ending in
    it), or ``rundir.MANIFEST``. Messages that mention run.json inside a sentence are not file names."""
    out = []
    for root in roots:
        for p in root.rglob("*.py"):
            for node in ast.walk(ast.parse(p.read_text())):
                named = (isinstance(node, ast.Constant) and isinstance(node.value, str)
                         and (node.value == "run.json" or node.value.endswith(("/run.json", "\\run.json"))))
                named = named or (isinstance(node, ast.Attribute) and node.attr == "MANIFEST")
                named = named or (isinstance(node, ast.alias) and node.name == "MANIFEST")
                if named:
                    out.append(str(p.relative_to(root.parent)))
                    break
    return sorted(out)


def test_only_rundir_names_run_json():
    assert manifest_namers(PKG, APP) == ["gpcore/run/rundir.py"]


def test_the_app_imports_nothing_from_the_cli():
    assert cli_importers(APP) == []
    assert not [m for m, deps in import_graph().items() if any(d == "app" or d.startswith("app.") for d in deps)]


def test_the_bar_checks_can_fail(tmp_path):
    """The scans above find what they look for (a cache that opens run.json itself, a page that imports the CLI)."""
    app = tmp_path / "app"
    app.mkdir()
    (app / "cache.py").write_text('import json\nfrom pathlib import Path\n\n\ndef manifest(p):\n'
                                  '    return json.loads((Path(p) / "run.json").read_text())\n')
    (app / "page.py").write_text("def cmd():\n    from gpcore.cli import main\n\n    return main\n")
    (app / "note.py").write_text('WARNING = "run(s) skipped (malformed run.json)"\n')
    (app / "other.py").write_text("from gpcore.run.rundir import MANIFEST\n")
    assert manifest_namers(app) == ["app/cache.py", "app/other.py"]
    assert cli_importers(app) == ["page.py"]
