"""What the browser tests share: Chromium's launch options and a JupyterLab on 127.0.0.1."""

from __future__ import annotations

import contextlib
import os
import secrets
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from nbckpt.procgroup import free_port

REPO = Path(__file__).resolve().parents[2]
ARTIFACTS = REPO / "artifacts"
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


def wait_for_server(
    url: str, proc: subprocess.Popen[bytes], log: Path, timeout_s: float = 90
) -> None:
    """Wait until ``url`` answers 200, or raise with the tail of the server's log."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            tail = "\n".join(log.read_text(errors="replace").splitlines()[-15:])
            raise RuntimeError(f"jupyter lab exited with code {proc.returncode}:\n{tail}")
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        time.sleep(0.3)
    raise TimeoutError(f"jupyter lab did not answer at {url} within {timeout_s} s")


@contextlib.contextmanager
def running_lab(server_root: Path, home: Path, app: str = "lab") -> Iterator[tuple[str, str]]:
    """Run JupyterLab (or Notebook 7) on 127.0.0.1 serving ``server_root``; yield ``(URL, token)``.

    ``home`` holds its config, settings, workspaces, runtime files and log, so the
    user's own Jupyter setup stays out of the test.

    Parameters
    ----------
    server_root
        The folder the server serves.
    home
        Where its config, settings, workspaces, runtime files and log go.
    app
        ``"lab"`` for JupyterLab, ``"notebook"`` for Notebook 7 (the ``notebook``
        package). Notebook 7 reads the same ``JUPYTERLAB_SETTINGS_DIR`` (its
        ``user_settings_dir`` comes from ``jupyterlab``'s ``get_user_settings_dir``), so
        a theme preset there (``screens.set_lab_theme``) before the server starts is
        the theme its pages open with.
    """
    if app not in ("lab", "notebook"):
        raise ValueError(f"app must be 'lab' or 'notebook', got {app!r}")
    port, token = free_port(), secrets.token_hex(16)
    env = dict(os.environ)
    env.update(
        JUPYTER_CONFIG_DIR=str(home / "config"),
        JUPYTERLAB_SETTINGS_DIR=str(home / "settings"),
        JUPYTERLAB_WORKSPACES_DIR=str(home / "workspaces"),
        JUPYTER_RUNTIME_DIR=str(home / "runtime"),
    )
    cmd = [
        sys.executable,
        "-m",
        "jupyterlab" if app == "lab" else "notebook",
        "--no-browser",
        "--ServerApp.ip=127.0.0.1",
        f"--ServerApp.port={port}",
        "--ServerApp.port_retries=0",
        f"--IdentityProvider.token={token}",
        f"--ServerApp.root_dir={server_root}",
        "--allow-root",  # CI containers run as root
    ]
    if app == "lab":
        # JupyterNotebookApp has none of these options (``python -m notebook
        # --help-all``): it registers no news, update-check or extension-manager
        # handlers, so there is nothing to turn off.
        cmd += [
            "--LabApp.news_url=",
            "--LabApp.extension_manager=readonly",
            "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
        ]
    # No "official Jupyter news?" toast over the page.
    labconfig = home / "config" / "labconfig"
    labconfig.mkdir(parents=True)
    (labconfig / "page_config.json").write_text(
        '{"disabledExtensions": {"@jupyterlab/apputils-extension:announcements": true}}'
    )
    log_path = home / "lab.log"
    log = log_path.open("wb")
    proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        base = f"http://127.0.0.1:{port}"
        wait_for_server(f"{base}/api/status?token={token}", proc, log_path)
        yield base, token
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


@contextlib.contextmanager
def lab_page(
    url: str,
    *,
    ready: str = "#jp-main-dock-panel",
    viewport: dict[str, int] | None = None,
) -> Iterator[Any]:
    """A headless Chromium page at ``url``, once the app has loaded.

    ``ready`` is what shows it has: JupyterLab's dock panel by default; Notebook 7's
    page has none (``#main-panel .jp-Notebook`` there).
    """
    from playwright.sync_api import sync_playwright

    ARTIFACTS.mkdir(exist_ok=True)
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport=viewport or {"width": 1400, "height": 900})
            page.set_default_timeout(30_000)
            page.goto(url)
            page.wait_for_selector(ready, state="visible", timeout=60_000)
            page.wait_for_selector("#jupyterlab-splash", state="detached", timeout=60_000)
            yield page
        finally:
            browser.close()


def write_notebook(path: Path, cells: list[str]) -> None:
    """Write a notebook of code ``cells`` for the python3 kernel."""
    import nbformat

    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
    nb.metadata["kernelspec"] = {
        "name": "python3",
        "display_name": "Python 3",
        "language": "python",
    }
    nbformat.write(nb, path)


def run_command(page: Any, label: str, attempts: int = 5) -> None:
    """Run a JupyterLab command from the command palette.

    Right after JupyterLab loads, the launcher (or a restored document) takes the focus
    and closes a palette opened meanwhile; so open it again until the command runs.
    """
    from playwright.sync_api import TimeoutError as PlaywrightTimeoutError

    palette = page.locator(".lm-CommandPalette-input")
    item = page.locator(".lm-CommandPalette-item", has_text=label).first
    for _ in range(attempts):
        if not palette.is_visible():
            page.keyboard.press("Control+Shift+C")
        try:
            palette.fill(label, timeout=5_000)
            item.click(timeout=5_000)
            return
        except PlaywrightTimeoutError:
            continue
    raise TimeoutError(f"could not run {label!r} from the command palette")
