"""The run store: a directory of run folders (their format: :mod:`gpcore.run.rundir`), plus bundled runs.

Default location: ``$UA_RUN_STORE`` if set, else the user's data directory
(``platformdirs.user_data_dir("uncertainty-atlas")/runs``). Runs shipped with the project
(``sample_data/runs/*``) are listed too, read-only, so a fresh install has content to show.
Everything is JSON, Parquet, GeoJSON and safetensors: nothing is unpickled.

Every manifest is read through one validated schema (:func:`gpcore.run.rundir.read_manifest`): a run
whose manifest is malformed is skipped and reported by :meth:`RunStore.invalid`, never handed to a page.
Symlinked run directories are ignored. Runs are written atomically (:func:`gpcore.run.rundir.writing`
writes a hidden ``.tmp-<id>-<pid>-<hex>`` folder and renames it); :meth:`RunStore.clean_leftovers`
removes what a killed process left behind.
"""

from __future__ import annotations

import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from gpcore.errors import GPCoreError, RunError
from gpcore.run import rundir

BUNDLED_RUNS = Path(__file__).resolve().parents[2] / "sample_data" / "runs"


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
    def seed(self) -> int:
        """The split's (and the model's) seed: runs on one data set and split kind share their test rows when they
        share it."""
        return int(self.manifest.get("config", {}).get("seed", 0))

    @property
    def data_hash(self) -> str:
        """The identity of the run's data set (:func:`gpcore.identity.dataset_identity`).

        Runs written by older code (a hash of transformed floats, or of periods as written: a ``hash_of`` note
        other than :data:`gpcore.identity.HASH_OF`) get it recomputed from their configuration when their file
        exists.
        """
        from gpcore.identity import HASH_OF, dataset_identity

        data = self.manifest.get("data", {}) if isinstance(self.manifest, dict) else {}
        if data.get("hash_of") != HASH_OF and isinstance(self.manifest.get("config"), dict):
            ident = dataset_identity(self.manifest["config"])
            if ident:
                return ident
        return data.get("hash", "")

    @property
    def period_free_hash(self) -> str:
        """The identity of the run's data set whatever its period (``dataset_identity(..., period=False)``; "" when
        its file is gone): equal for runs on other quarters of one file and spec."""
        from gpcore.identity import dataset_identity

        config = self.manifest.get("config") if isinstance(self.manifest, dict) else None
        return (dataset_identity(config, period=False) or "") if isinstance(config, dict) else ""


def load_run(run_dir, device: str | None = None):
    """``(manifest, model)`` of a run directory written by :func:`gpcore.run.pipeline.execute_run`.

    The manifest is validated and the model checked before anything is allocated; a damaged run raises
    :class:`RunError` (or :class:`gpcore.errors.InputError` for the model files) naming the file.
    """
    manifest = rundir.read_manifest(run_dir)
    return manifest, rundir.load_model(run_dir, device=device)


class RunStore:
    """List, create and delete runs under ``root`` (created on demand)."""

    def __init__(self, root: str | Path | None = None, include_bundled: bool = True):
        self.root = Path(root) if root is not None else default_store_dir()
        self.include_bundled = include_bundled
        self._invalid: list[tuple[str, str]] = []

    def new_run_dir(self, run_id: str) -> Path:
        """Reserve a run directory (created atomically, empty): ``run_id``, else ``run_id-2``, ``-3``, ...

        Concurrent callers always get distinct directories; :func:`gpcore.run.pipeline.execute_run` fills it.
        """
        self.root.mkdir(parents=True, exist_ok=True)
        for i in range(1, 1000):
            path = self.root / (run_id if i == 1 else f"{run_id}-{i}")
            try:
                path.mkdir()
            except FileExistsError:
                continue
            return path
        raise RunError(f"run '{run_id}' already exists in {self.root} (and 998 numbered variants)")

    def _scan(self, base: Path, bundled: bool) -> list[RunInfo]:
        out = []
        if not base.is_dir():
            return out
        for p in sorted(base.iterdir()):
            if p.name.startswith(".") or p.is_symlink() or not p.is_dir():
                continue  # hidden temporary folders, and links that could point outside the store
            if not rundir.is_run_dir(p):
                continue  # a reserved (still training) or foreign folder is not a run
            try:
                manifest = rundir.read_manifest(p)
            except RunError as e:
                self._invalid.append((p.name, str(e)))
                continue
            out.append(RunInfo(p.name, p, manifest, bundled))
        return out

    def list(self) -> list[RunInfo]:
        """All valid runs, newest first; bundled runs last. Malformed ones: see :meth:`invalid`."""
        self._invalid = []
        own = sorted(self._scan(self.root, False), key=lambda r: r.manifest.get("created", ""), reverse=True)
        bundled = self._scan(BUNDLED_RUNS, True) if self.include_bundled else []
        seen = {r.run_id for r in own}
        return own + [r for r in bundled if r.run_id not in seen]

    def invalid(self) -> list[tuple[str, str]]:
        """``(run id, reason)`` of the runs the last :meth:`list` skipped because their manifest is malformed."""
        return list(self._invalid)

    def clean_leftovers(self, max_age_s: float = 3600.0) -> list[str]:
        """Remove what killed processes left in the store: ``.tmp-*`` folders of processes that are gone
        (or older than a day), and empty reserved run folders older than ``max_age_s``. Returns their names."""
        removed: list[str] = []
        if not self.root.is_dir():
            return removed
        now = time.time()
        for p in self.root.iterdir():
            try:
                if p.is_symlink() or not p.is_dir():
                    continue
                age = now - p.stat().st_mtime
                m = rundir.TMP_RE.fullmatch(p.name)
                if m and (not rundir.pid_alive(int(m.group(1))) or age > 86400):
                    shutil.rmtree(p, ignore_errors=True)
                    removed.append(p.name)
                elif not p.name.startswith(("_", ".")) and age > max_age_s and not any(p.iterdir()):
                    p.rmdir()
                    removed.append(p.name)
            except OSError:
                continue
        return removed

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

