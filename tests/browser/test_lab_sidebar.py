"""The Checkpoints sidebar in a real JupyterLab, driven by Playwright in Debian's Chromium.

A 2-process JAX job makes a real root: step 1 commits; the save of step 2 is abandoned
because process 1 exits abruptly at the ``write_complete`` barrier. JupyterLab then
serves that root on 127.0.0.1, and the test opens the sidebar from the command palette,
checks both states (and a step Orbax wrote, marked as such) and opens each save's
per-process timeline. Screenshots go to
``artifacts/``.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from nbckpt.layout import TMP_SUFFIX, all_steps
from nbckpt.procgroup import ProcessGroup
from tests.browser.labserver import ARTIFACTS, REPO, lab_page, run_command, running_lab

pytestmark = [pytest.mark.browser, pytest.mark.multihost]

T = "tests.lab_tasks"


@pytest.fixture(scope="module")
def server_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A server root holding ``ckpt/``: step 1 complete, step 2 abandoned by a kill."""
    server_root = tmp_path_factory.mktemp("lab")
    root = server_root / "ckpt"
    env = {"PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    with ProcessGroup(2, env=env, recoverable=True) as group:
        assert group.run(f"{T}:save", str(root), 1) == [None, None]
        group.submit(f"{T}:save", str(root), 2, kwargs={"kill_at": "barrier:write_complete"})
        with pytest.raises(Exception, match="worker exited"):
            group.collect("killed save", timeout_s=120)
    assert all_steps(root) == [1]
    assert (root / f"2{TMP_SUFFIX}").is_dir()
    # A step Orbax itself wrote into the same root: listed, marked as Orbax's.
    import numpy as np
    import orbax.checkpoint as ocp

    orbax_ckptr = ocp.StandardCheckpointer()
    orbax_ckptr.save((root / "7").absolute(), {"x": np.arange(4.0)})
    orbax_ckptr.wait_until_finished()
    assert all_steps(root) == [1, 7]
    return server_root


@pytest.fixture(scope="module")
def lab(server_root: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A JupyterLab on 127.0.0.1 serving ``server_root``; yields its URL with the token."""
    with running_lab(server_root, tmp_path_factory.mktemp("jupyter-home")) as (base, token):
        yield f"{base}/lab?token={token}"


def test_sidebar_shows_states_and_timelines(lab: str, server_root: Path) -> None:
    from playwright.sync_api import expect

    with lab_page(lab) as page:
        # The command-palette entry opens the sidebar.
        run_command(page, "Open Checkpoints Sidebar")
        sidebar = page.locator("#nbckpt-sidebar")
        expect(sidebar).to_be_visible()

        sidebar.locator(".nbckpt-root-input").fill("ckpt")
        sidebar.locator(".nbckpt-root-open").click()
        steps = sidebar.locator(".nbckpt-steps")
        complete = steps.locator("tr.nbckpt-step[data-path='1']")
        abandoned = steps.locator("tr.nbckpt-step[data-path='2.nbckpt-tmp']")
        expect(complete.locator(".nbckpt-badge-complete")).to_have_text("complete")
        expect(abandoned.locator(".nbckpt-badge-abandoned")).to_have_text("abandoned")
        expect(complete.locator(".nbckpt-procs")).to_have_text("2")
        expect(complete.locator(".nbckpt-size")).to_contain_text("KiB")
        orbax = steps.locator("tr.nbckpt-step[data-path='7']")
        expect(orbax.locator(".nbckpt-badge-complete")).to_have_text("complete")
        expect(orbax.locator(".nbckpt-format")).to_have_text("Orbax")
        expect(complete.locator(".nbckpt-format")).to_have_count(0)
        page.screenshot(path=ARTIFACTS / "lab_sidebar_steps.png")

        # The committed save: one row per process, barrier waits drawn apart.
        complete.click()
        timeline = sidebar.locator(".nbckpt-timeline-section")
        expect(timeline.locator(".nbckpt-badge-committed")).to_be_visible()
        rows = timeline.locator(".nbckpt-timeline-row")
        expect(rows).to_have_count(2)
        assert rows.nth(0).get_attribute("data-process") == "0"
        assert rows.nth(1).get_attribute("data-process") == "1"
        for i in range(2):
            expect(rows.nth(i).locator(".nbckpt-span-write")).to_have_count(1)
            assert rows.nth(i).locator(".nbckpt-span-barrier").count() == 3
        page.screenshot(path=ARTIFACTS / "lab_timeline_committed.png")

        # The killed save: it failed; process 0 timed out waiting for process 1.
        abandoned.click()
        expect(timeline.locator(".nbckpt-badge-failed")).to_be_visible()
        expect(rows).to_have_count(2)
        expect(timeline.locator(".nbckpt-span-failed").first).to_be_visible()
        expect(timeline.locator(".nbckpt-timeline-errors")).to_contain_text("process 1")
        page.screenshot(path=ARTIFACTS / "lab_timeline_abandoned.png")

        _follow_a_save_in_progress(page, server_root / "ckpt")


def _follow_a_save_in_progress(page: Any, root: Path) -> None:
    """A save stalled at its last barrier shows as in progress, then commits on its own."""
    from playwright.sync_api import expect

    env = {"PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    with ProcessGroup(2, env=env) as group:
        stall = {"stall_at": "barrier:write_complete", "stall_s": 8.0}
        group.submit(f"{T}:save", str(root), 3, kwargs=stall)
        sidebar = page.locator("#nbckpt-sidebar")
        steps = sidebar.locator(".nbckpt-steps")
        status = page.locator(".nbckpt-statusbar")
        # Until the step is published, its row is the temporary directory (rename mode).
        deadline = time.monotonic() + 60
        while not (root / "3").is_dir() and time.monotonic() < deadline:
            sidebar.locator(".nbckpt-refresh").click()
            running = steps.locator(".nbckpt-badge-in_progress")
            if running.count() and status.is_visible():
                break
            page.wait_for_timeout(300)
        expect(steps.locator(".nbckpt-badge-in_progress")).to_be_visible(timeout=1)
        expect(status).to_have_text("Checkpoint: 1 saving")
        page.screenshot(path=ARTIFACTS / "lab_save_in_progress.png")
        # No more clicks: the sidebar refreshes by itself until the save commits.
        committed = steps.locator("tr.nbckpt-step[data-path='3'] .nbckpt-badge-complete")
        expect(committed).to_be_visible(timeout=30_000)
        expect(status).to_be_hidden()
        assert group.collect("stalled save", timeout_s=60) == [None, None]
