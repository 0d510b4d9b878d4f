"""The run store: a directory of run directories (see :mod:`gpcore.runs`), plus bundled runs.

Default location: ``$UA_RUN_STORE`` if set, else the user's data directory
(``platformdirs.user_data_dir("uncertainty-atlas")/runs``). Runs shipped with the project
(``sample_data/runs/*``) are listed too, read-only, so a fresh install has content to show.
Everything is JSON, Parquet, GeoJSON and safetensors: nothing is unpickled.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from gpcore.errors import GPCoreError

BUNDLED_RUNS = Path(__file__).resolve().parent.parent / "sample_data" / "runs"


def default_store_dir() -> Path:
    env = os.environ.get("UA_RUN_STORE")
    if env:
        return Path(env)
    from platformdirs import user_data_dir

    return Path(user_data_dir("uncertainty-atlas")) / "runs"


@dataclass(frozen=True)
class RunInfo:
    run_id: str
    path: Path
    manifest: dict
    bundled: bool

    @property
    def label(self) -> str:
        return self.manifest.get("label") or self.run_id

    @property
    def model(self) -> str:
        return self.manifest.get("config", {}).get("model", "?")

    @property
    def data_hash(self) -> str:
        """The identity of the run's data set (:func:`gpcore.identity.dataset_identity`).

        Runs written before identities were content hashes stored a hash of transformed floats; for
        those (no ``hash_of`` note) it is recomputed from the run's configuration when its file exists.
        """
        data = self.manifest.get("data", {}) if isinstance(self.manifest, dict) else {}
        if data.get("hash_of") is None and isinstance(self.manifest.get("config"), dict):
            from gpcore.identity import dataset_identity

            ident = dataset_identity(self.manifest["config"])
            if ident:
                return ident
        return data.get("hash", "")


class RunStore:
    """List, create and delete runs under ``root`` (created on demand)."""

    def __init__(self, root: str | Path | None = None, include_bundled: bool = True):
        self.root = Path(root) if root is not None else default_store_dir()
        self.include_bundled = include_bundled

    def new_run_dir(self, run_id: str) -> Path:
        self.root.mkdir(parents=True, exist_ok=True)
        path = self.root / run_id
        if path.exists():
            raise GPCoreError(f"run '{run_id}' already exists in {self.root}")
        return path

    def _scan(self, base: Path, bundled: bool) -> list[RunInfo]:
        out = []
        if not base.is_dir():
            return out
        for p in sorted(base.iterdir()):
            mf = p / "run.json"
            if not mf.is_file():
                continue
            try:
                manifest = json.loads(mf.read_text())
            except (OSError, json.JSONDecodeError):
                continue  # a half-written or foreign directory is not a run
            out.append(RunInfo(p.name, p, manifest, bundled))
        return out

    def list(self) -> list[RunInfo]:
        """All runs, newest first; bundled runs last."""
        own = sorted(self._scan(self.root, False), key=lambda r: r.manifest.get("created", ""), reverse=True)
        bundled = self._scan(BUNDLED_RUNS, True) if self.include_bundled else []
        seen = {r.run_id for r in own}
        return own + [r for r in bundled if r.run_id not in seen]

    def get(self, run_id: str) -> RunInfo:
        for r in self.list():
            if r.run_id == run_id:
                return r
        raise GPCoreError(f"no run '{run_id}' in {self.root}")

    def delete(self, run_id: str) -> None:
        info = self.get(run_id)
        if info.bundled:
            raise GPCoreError(f"run '{run_id}' ships with the project and cannot be deleted")
        shutil.rmtree(info.path)
