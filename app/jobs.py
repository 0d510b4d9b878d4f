"""Training in a background thread, so the page stays live and a Cancel button can be pressed.

A :class:`TrainingJob` runs :func:`gpcore.run.pipeline.execute_run` (the one pipeline) in a daemon
thread. The per-epoch callback records :class:`gpcore.models.training.Progress` and returns ``False``
once :meth:`TrainingJob.cancel` was called; the trainer then keeps the best model so far and
``execute_run`` still writes the run (marked cancelled). The page polls the job with
``st.fragment(run_every=...)``. No Streamlit here.
"""

from __future__ import annotations

import logging
import shutil
import threading
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

from gpcore.errors import GPCoreError

log = logging.getLogger(__name__)


@dataclass
class TrainingJob:
    """State of one training run, shared between the worker thread and the page."""

    run_id: str
    run_dir: Path
    label: str
    epochs: int
    started: float = field(default_factory=time.time)
    stage: str = "starting"
    history: list[dict] = field(default_factory=list)
    error: str | None = None
    finished: float | None = None
    _cancel: threading.Event = field(default_factory=threading.Event, repr=False)
    _thread: threading.Thread | None = field(default=None, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    # ------------------------------------------------------------------ queries (page side)
    @property
    def done(self) -> bool:
        return self.finished is not None

    @property
    def ok(self) -> bool:
        return self.done and self.error is None

    @property
    def cancelled(self) -> bool:
        return self._cancel.is_set()

    def snapshot(self) -> list[dict]:
        """A copy of the per-epoch history (safe to read while the thread appends)."""
        with self._lock:
            return list(self.history)

    @property
    def fraction(self) -> float:
        if self.done:
            return 1.0
        hist = self.snapshot()
        if not hist:
            return 0.0
        return min(hist[-1]["epoch"] / max(self.epochs, 1), 1.0) * 0.95

    def cancel(self) -> None:
        """Ask the trainer to stop after the current epoch (the best model so far is kept)."""
        self._cancel.set()

    def wait(self, timeout: float | None = None) -> bool:
        if self._thread is not None:
            self._thread.join(timeout)
        return self.done

    # ------------------------------------------------------------------ worker side
    def _callback(self, progress) -> bool:
        with self._lock:
            self.history.append(progress.to_dict())
        self.stage = f"training: epoch {progress.epoch} of {progress.epochs}"
        if self._cancel.is_set():
            self.stage = "cancelled: keeping the best model so far, predicting on the grid"
            return False
        if progress.epoch >= progress.epochs:
            self.stage = "training done: scoring the test split, predicting on the grid, saving"
        return True

    def _log(self, message: str) -> None:
        if message.startswith("data:"):
            self.stage = "training"


def configure_torch_threads() -> int:
    """Torch CPU threads for this server: ``$UA_TORCH_THREADS``, else all cores but one.

    The server, the browser and the training thread share the machine; on 2 cores two busy
    OpenMP threads next to the server slow training down many times (measured 0.5 s vs 17 s
    per epoch under load), so one core is left free.
    """
    import os

    import torch

    env = os.environ.get("UA_TORCH_THREADS", "").strip()
    n = int(env) if env.isdigit() and int(env) > 0 else max(1, (os.cpu_count() or 2) - 1)
    if torch.get_num_threads() != n:
        torch.set_num_threads(n)
    return n


def start_training(cfg, run_dir: Path, prepared=None, label: str = "") -> TrainingJob:
    """Start ``execute_run(cfg, run_dir)`` in a daemon thread and return its job."""
    from gpcore.run.pipeline import execute_run, prepare

    epochs = int({**_defaults(cfg.model), **cfg.settings}.get("epochs", 1))
    job = TrainingJob(run_id=Path(run_dir).name, run_dir=Path(run_dir), label=label or cfg.model, epochs=epochs)

    def work():
        try:
            job.stage = "preparing the data"
            prep = prepared if prepared is not None else prepare(cfg)
            job.stage = "training"
            execute_run(cfg, run_dir, callback=job._callback, prepared=prep, log=job._log)
            job.stage = "cancelled (best model kept)" if job.cancelled else "done"
        except GPCoreError as exc:
            job.error = str(exc)
        except Exception as exc:  # the page shows it; the server keeps running
            log.error("training failed:\n%s", traceback.format_exc())
            job.error = f"{type(exc).__name__}: {exc}"
        finally:
            if job.error is not None and Path(run_dir).exists():
                shutil.rmtree(run_dir, ignore_errors=True)
            job.finished = time.time()

    job._thread = threading.Thread(target=work, name=f"train-{job.run_id}", daemon=True)
    job._thread.start()
    return job


def _defaults(model: str) -> dict:
    from gpcore.models import model_spec

    spec = model_spec(model)
    return {**spec.cls.Config().to_dict(), **spec.preset}
