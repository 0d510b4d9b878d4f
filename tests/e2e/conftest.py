"""Fixtures for the browser tests: a ``streamlit run`` server on 127.0.0.1 and headless Chromium.

The server gets a temporary run store (``UA_RUN_STORE``), so the user's runs are never touched;
the bundled ready run still shows. Its port is polled via ``/_stcore/health``. Chromium is the
system one (``/usr/bin/chromium``; ``scripts/test.sh`` installs it in CI).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tests.net import free_port

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "test-artifacts"
CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", "--no-first-run",
]


def chromium_path() -> str | None:
    for cand in (os.environ.get("UA_CHROMIUM"), "/usr/bin/chromium", shutil.which("chromium"),
                 shutil.which("chromium-browser")):
        if cand and Path(cand).exists():
            return cand
    return None


def wait_healthy(url: str, proc: subprocess.Popen, timeout: float = 90.0) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"streamlit exited with status {proc.returncode}")
        try:
            with urllib.request.urlopen(f"{url}/_stcore/health", timeout=2) as r:
                if r.status == 200 and r.read().strip() == b"ok":
                    return
        except OSError:
            pass
        time.sleep(0.3)
    raise TimeoutError(f"streamlit did not answer {url}/_stcore/health within {timeout:.0f} s")


def start_server(store: Path, log_path: Path) -> tuple[subprocess.Popen, str]:
    """``streamlit run app/main.py`` on a free port of 127.0.0.1 with ``UA_RUN_STORE=store``; returns (process, url).

    Shared by the browser tests and ``benchmarks/bench_browser.py``; the log goes to ``log_path``.
    """
    port = free_port()
    env = {**os.environ, "UA_RUN_STORE": str(store), "UA_TORCH_THREADS": "1", "PYTHONUNBUFFERED": "1",
           "PYTHONPATH": str(ROOT)}
    cmd = [
        sys.executable, "-m", "streamlit", "run", str(ROOT / "app" / "main.py"),
        "--server.address", "127.0.0.1", "--server.port", str(port), "--server.headless", "true",
        "--server.fileWatcherType", "none", "--browser.gatherUsageStats", "false",
    ]
    log = open(log_path, "w+")  # noqa: SIM115 - closed by stop_server
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    proc.log = log
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, proc)
    except Exception:
        log.seek(0)
        print(log.read()[-4000:])
        stop_server(proc)
        raise
    return proc, url


def stop_server(proc: subprocess.Popen) -> None:
    """Stop a :func:`start_server` process group (TERM, then KILL) and close its log."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(5)
    proc.log.close()


@pytest.fixture(scope="session")
def server(tmp_path_factory):
    """``streamlit run app/main.py`` on a free port of 127.0.0.1; yields its base URL."""
    store = tmp_path_factory.mktemp("e2e-runs")
    proc, url = start_server(store, tmp_path_factory.mktemp("e2e-log") / "streamlit.log")
    try:
        yield url
    finally:
        stop_server(proc)


@pytest.fixture(scope="session")
def browser():
    path = chromium_path()
    if path is None:
        pytest.fail("Chromium not found (install it: apt-get install -y chromium, or set UA_CHROMIUM)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=path, args=CHROMIUM_ARGS)
        yield b
        b.close()


@pytest.fixture
def page(browser):
    ARTIFACTS.mkdir(exist_ok=True)
    ctx = browser.new_context(viewport={"width": 1500, "height": 1150})
    pg = ctx.new_page()
    pg.set_default_timeout(60_000)
    yield pg
    ctx.close()
