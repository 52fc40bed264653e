"""The Checkpoints sidebar in a real JupyterLab, driven by Playwright in Debian's Chromium.

A 2-process JAX job makes a real root: step 1 commits; the save of step 2 is abandoned
because process 1 exits abruptly at the ``write_complete`` barrier. JupyterLab then
serves that root on 127.0.0.1, and the first test opens the sidebar from the command
palette, checks both states (and a step Orbax wrote, marked as such) and opens each
save's per-process timeline. The others follow the notebook: the roots running clusters
registered (as ``%ckpt_cluster start --dir`` does, in the lab's runtime folder) and
those found on disk, absolute roots, the root a workspace remembers across a reload, a
switch of root, and the status bar over every running cluster's root. Each test has a
workspace of its own. Screenshots go to ``artifacts/``.
"""

from __future__ import annotations

import json
import os
import re
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from nbckpt.formats.layout import TMP_SUFFIX, all_steps
from nbckpt.procgroup import ProcessGroup
from nbckpt.protocol import barrier_op_id, new_op_id
from nbckpt.session.cluster import JaxCluster
from tests.browser.labserver import ARTIFACTS, REPO, lab_page, run_command, running_lab
from tests.ckpt_fixtures import journal, write_step
from tests.journal_scripts import many_save, write_script

pytestmark = [pytest.mark.browser, pytest.mark.multihost]

T = "tests.lab_tasks"
ENV = {"PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
#: A root two levels down, with a committed save and a journaled user barrier.
NESTED = "notebooks/run-a"
SAVE_A = new_op_id("save", 5)
BARRIER_A = barrier_op_id("4c93ac533cb54f60", "after-save")
#: A root with one save of 1,024 processes, process 17 two seconds late (scripted).
MANY = "many"
SAVE_MANY = new_op_id("save", 7)


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
    nested = server_root / NESTED
    journal(nested, SAVE_A, 5, t0=time.time())
    write_step(nested, 5, op=SAVE_A)
    journal(nested, BARRIER_A, 0, kind="barrier", t0=time.time())
    (server_root / "notebooks" / "data" / "2024").mkdir(parents=True)  # no root
    write_script(server_root / MANY, SAVE_MANY, many_save())
    return server_root


@dataclass(frozen=True)
class Lab:
    """A running JupyterLab: its URL, token, and the runtime folder its kernels share."""

    base: str
    token: str
    runtime: Path

    def url(self, workspace: str) -> str:
        """The lab in a workspace of its own (each remembers its own sidebar root)."""
        return f"{self.base}/lab/workspaces/{workspace}?token={self.token}"

    def workspace(self, name: str) -> dict[str, Any]:
        """The workspace as the server stores it."""
        url = f"{self.base}/lab/api/workspaces/{name}?token={self.token}"
        with urllib.request.urlopen(url, timeout=10) as response:
            data: dict[str, Any] = json.loads(response.read())
        return data


@pytest.fixture(scope="module")
def lab(server_root: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    """A JupyterLab on 127.0.0.1 serving ``server_root``."""
    home = tmp_path_factory.mktemp("jupyter-home")
    with running_lab(server_root, home) as (base, token):
        yield Lab(base, token, home / "runtime")


@pytest.fixture
def register(lab: Lab, monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[Path], None]]:
    """Register a root as ``%ckpt_cluster start --dir`` does, in the lab's runtime folder.

    The record names this test's process, which is alive; it is removed at the end.
    """
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(lab.runtime))
    clusters: list[JaxCluster] = []

    def add(root: Path) -> None:
        cluster = JaxCluster(cluster_id=f"browser-{len(clusters)}")
        assert cluster.register_root(str(root)) is not None
        clusters.append(cluster)

    yield add
    for cluster in clusters:
        cluster.unregister_root()


def _open_sidebar(page: Any) -> Any:
    """Show the sidebar by its tab (the palette is tested above, and slow under load)."""
    from playwright.sync_api import expect

    sidebar = page.locator("#nbckpt-sidebar")
    if not sidebar.is_visible():
        page.locator(".lm-TabBar-tab[data-id='nbckpt-sidebar']").click()
    expect(sidebar).to_be_visible()
    return sidebar


def _open_root(sidebar: Any, root: str) -> None:
    sidebar.locator(".nbckpt-root-input").fill(root)
    sidebar.locator(".nbckpt-root-open").click()


def test_sidebar_shows_states_and_timelines(lab: Lab, server_root: Path) -> None:
    from playwright.sync_api import expect

    with lab_page(lab.url("states")) as page:
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

    with ProcessGroup(2, env=ENV) as group:
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


def test_roots_of_running_clusters_and_roots_on_disk_are_offered(
    lab: Lab, server_root: Path, register: Callable[[Path], None]
) -> None:
    """With nothing remembered, the newest running cluster's root opens; the rest are listed."""
    from playwright.sync_api import expect

    register(server_root / NESTED)
    with lab_page(lab.url("roots")) as page:
        sidebar = _open_sidebar(page)
        expect(sidebar.locator(".nbckpt-root-input")).to_have_value(NESTED)
        expect(sidebar.locator("tr.nbckpt-step[data-path='5']")).to_be_visible()
        roots = sidebar.locator(".nbckpt-roots")
        if not roots.evaluate("details => details.open"):
            roots.locator("summary").click()
        cluster = roots.locator(f"li.nbckpt-root-cluster[data-root='{NESTED}']")
        expect(cluster).to_be_visible()
        expect(cluster).to_contain_text("cluster")
        found = roots.locator("li.nbckpt-root-found")
        # ckpt and the 1,024-process root; the cluster's root is not listed twice.
        expect(found).to_have_count(2)
        ckpt = roots.locator("li.nbckpt-root-found[data-root='ckpt']")
        expect(ckpt).to_have_count(1)
        expect(roots.locator(f"li.nbckpt-root-found[data-root='{MANY}']")).to_have_count(1)
        page.screenshot(path=ARTIFACTS / "lab_sidebar_roots.png")
        ckpt.click()
        expect(sidebar.locator(".nbckpt-root-input")).to_have_value("ckpt")
        expect(sidebar.locator("tr.nbckpt-step[data-path='1']")).to_be_visible()


#: How many requests the page made to one nbckpt route (the browser's own count).
COUNT = (
    "performance.getEntriesByType('resource').filter(e => e.name.includes('/nbckpt/api/%s')).length"
)


def _requests(page: Any, route: str) -> int:
    return int(page.evaluate(COUNT % route))


def test_an_absolute_root_under_the_server_root_opens(lab: Lab, server_root: Path) -> None:
    from playwright.sync_api import expect

    with lab_page(lab.url("absolute")) as page:
        sidebar = _open_sidebar(page)
        _open_root(sidebar, str(server_root / "ckpt"))
        expect(sidebar.locator("tr.nbckpt-step[data-path='1']")).to_be_visible()
        status = sidebar.locator(".nbckpt-status")
        expect(status).to_contain_text(re.compile(r"\b(1 entry|\d+ entries) in ckpt"))
        _open_root(sidebar, "/etc")
        error = sidebar.locator(".nbckpt-status.nbckpt-error")
        expect(error).to_contain_text("'/etc' is outside the server's root")
        expect(error).to_contain_text("(not asked again until Refresh)")
        expect(sidebar.locator("tr.nbckpt-step")).to_have_count(0)
        # A refused root is not polled: the review saw two 403s every 4 s. The
        # activity poll goes on; two of its rounds pass without a request for the root.
        refused = _requests(page, "checkpoints")
        page.wait_for_function(
            f"n => ({COUNT % 'activity'}) >= n",
            arg=_requests(page, "activity") + 2,
            timeout=30_000,
        )
        assert _requests(page, "checkpoints") == refused
        sidebar.locator("button.nbckpt-refresh").click()  # the user asks: asked again
        page.wait_for_function(f"n => ({COUNT % 'checkpoints'}) > n", arg=refused)


def test_the_workspace_remembers_the_root_across_a_reload(lab: Lab) -> None:
    from playwright.sync_api import TimeoutError as PlaywrightTimeoutError
    from playwright.sync_api import expect

    with lab_page(lab.url("remember")) as page:
        sidebar = _open_sidebar(page)
        _open_root(sidebar, NESTED)
        expect(sidebar.locator("tr.nbckpt-step[data-path='5']")).to_be_visible()
        # JupyterLab saves the workspace a moment after its state changes.
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            data = lab.workspace("remember").get("data", {})
            if data.get("nbckpt:sidebar", {}).get("root") == NESTED:
                break
            page.wait_for_timeout(300)
        assert lab.workspace("remember")["data"]["nbckpt:sidebar"] == {"root": NESTED}

        page.reload()
        page.wait_for_selector("#jupyterlab-splash", state="detached", timeout=60_000)
        # The layout restorer shows the sidebar again; if it does not, the tab does.
        sidebar = page.locator("#nbckpt-sidebar")
        try:
            sidebar.wait_for(state="visible", timeout=15_000)
        except PlaywrightTimeoutError:
            sidebar = _open_sidebar(page)
        expect(sidebar.locator(".nbckpt-root-input")).to_have_value(NESTED)
        expect(sidebar.locator("tr.nbckpt-step[data-path='5']")).to_be_visible()
        page.screenshot(path=ARTIFACTS / "lab_sidebar_after_reload.png")

    # Another workspace remembers its own root, not this one.
    with lab_page(lab.url("elsewhere")) as page:
        sidebar = _open_sidebar(page)
        expect(sidebar.locator(".nbckpt-status")).to_contain_text("Choose a checkpoint root")
        expect(sidebar.locator(".nbckpt-root-input")).to_have_value("")


def test_switching_root_clears_the_timeline_and_drops_late_answers(lab: Lab) -> None:
    from playwright.sync_api import expect

    with lab_page(lab.url("switch")) as page:
        sidebar = _open_sidebar(page)
        timeline = sidebar.locator(".nbckpt-timeline-section")
        _open_root(sidebar, "ckpt")
        sidebar.locator("tr.nbckpt-step[data-path='1']").click()
        expect(timeline.locator(".nbckpt-timeline-row")).to_have_count(2)

        _open_root(sidebar, NESTED)
        expect(sidebar.locator("tr.nbckpt-step[data-path='5']")).to_be_visible()
        expect(timeline.locator("*")).to_have_count(0)
        expect(sidebar.locator(".nbckpt-op.nbckpt-selected")).to_have_count(0)

        # An operation asked for in this root, answered only after the switch back.
        held: list[Any] = []
        pattern = re.compile(r"/nbckpt/api/operations/[^?]+\?")
        page.route(pattern, lambda route: held.append(route))
        sidebar.locator(f".nbckpt-op[data-op='{SAVE_A}']").click()
        deadline = time.monotonic() + 15
        while not held and time.monotonic() < deadline:
            page.wait_for_timeout(100)
        assert len(held) == 1
        _open_root(sidebar, "ckpt")
        expect(sidebar.locator("tr.nbckpt-step[data-path='1']")).to_be_visible()
        held[0].continue_()
        page.unroute(pattern)
        page.wait_for_timeout(1500)  # the late answer arrives, and must be dropped
        expect(timeline.locator("*")).to_have_count(0)
        expect(sidebar.locator(".nbckpt-op.nbckpt-selected")).to_have_count(0)


def test_a_job_of_many_processes_is_shown_as_a_whole(lab: Lab) -> None:
    """1,024 processes: the summary, 8 lanes (the straggler first), one more on request."""
    from playwright.sync_api import expect

    with lab_page(lab.url("many")) as page:
        sidebar = _open_sidebar(page)
        _open_root(sidebar, MANY)
        sidebar.locator(f".nbckpt-op[data-op='{SAVE_MANY}']").click()
        timeline = sidebar.locator(".nbckpt-timeline-section")
        headline = timeline.locator(".nbckpt-summary-headline")
        expect(headline).to_have_text("1,024 of 1,024 committed")
        expect(timeline.locator(".nbckpt-summary-spread")).to_have_count(3)
        expect(timeline.locator(".nbckpt-summary-spread").first).to_contain_text("last: 17")
        rows = timeline.locator(".nbckpt-timeline-row")
        expect(rows).to_have_count(8)
        expect(rows.first).to_have_attribute("data-process", "17")
        # Only the summary speaks for the processes not drawn: no "left no journal".
        expect(timeline.locator(".nbckpt-error")).to_have_count(0)
        rows.last.scroll_into_view_if_needed()
        sidebar.screenshot(path=ARTIFACTS / "lab_timeline_many_light.png")
        timeline.locator(".nbckpt-process-input").fill("5")
        timeline.locator(".nbckpt-process-open").click()
        expect(rows).to_have_count(9)
        expect(timeline.locator(".nbckpt-timeline-row[data-process='5']")).to_have_count(1)
        run_command(page, "Use Theme: JupyterLab Dark")
        expect(page.locator("body")).to_have_attribute("data-jp-theme-light", "false")
        expect(page.locator("#jupyterlab-splash")).to_have_count(0, timeout=30_000)
        expect(rows).to_have_count(9)
        rows.last.scroll_into_view_if_needed()
        page.wait_for_timeout(300)
        sidebar.screenshot(path=ARTIFACTS / "lab_timeline_many_dark.png")
        run_command(page, "Use Theme: JupyterLab Light")


def test_barriers_are_listed_by_name(lab: Lab) -> None:
    from playwright.sync_api import expect

    with lab_page(lab.url("barriers")) as page:
        sidebar = _open_sidebar(page)
        _open_root(sidebar, NESTED)
        barrier = sidebar.locator(f".nbckpt-op[data-op='{BARRIER_A}'] .nbckpt-op-kind")
        expect(barrier).to_have_text("barrier after-save")
        save = sidebar.locator(f".nbckpt-op[data-op='{SAVE_A}'] .nbckpt-op-kind")
        expect(save).to_have_text("save 5")


def test_the_status_bar_follows_every_running_clusters_root(
    lab: Lab, server_root: Path, register: Callable[[Path], None]
) -> None:
    """Saves in a cluster's root count while the sidebar shows another root, or hides.

    A hidden sidebar stops reloading its root; the status bar goes on.
    """
    from playwright.sync_api import expect

    live = server_root / "live"
    register(live)
    requests: list[str] = []
    with lab_page(lab.url("status")) as page:
        page.on("request", lambda request: requests.append(request.url))
        sidebar = _open_sidebar(page)
        _open_root(sidebar, "ckpt")
        expect(sidebar.locator("tr.nbckpt-step[data-path='1']")).to_be_visible()
        status = page.locator(".nbckpt-statusbar")
        with ProcessGroup(2, env=ENV) as group:
            stall = {"stall_at": "barrier:write_complete", "stall_s": 25.0}
            group.submit(f"{T}:save", str(live), 1, kwargs=stall)
            # No clicks: the status bar finds the save in the cluster's root by itself.
            expect(status).to_have_text("Checkpoint: 1 saving", timeout=60_000)
            page.screenshot(path=ARTIFACTS / "lab_statusbar_other_root.png")
            _open_root(sidebar, "live")
            expect(sidebar.locator(".nbckpt-steps .nbckpt-badge-in_progress")).to_be_visible()
            expect(status).to_have_text("Checkpoint: 1 saving")  # counted once

            # Hide the sidebar: its root is no longer reloaded, the status bar still is.
            page.locator(".lm-TabBar-tab[data-id='nbckpt-sidebar']").click()
            expect(sidebar).to_be_hidden()
            page.wait_for_timeout(500)
            requests.clear()
            page.wait_for_timeout(3000)
            assert not [u for u in requests if "/nbckpt/api/checkpoints" in u]
            assert [u for u in requests if "/nbckpt/api/activity" in u]
            assert not (live / "1").is_dir(), "the save ended before the check"
            expect(status).to_be_hidden(timeout=60_000)
            assert group.collect("stalled save", timeout_s=60) == [None, None]

    with ProcessGroup(2, env=ENV, recoverable=True) as group:
        group.submit(f"{T}:save", str(live), 2, kwargs={"kill_at": "barrier:write_complete"})
        with pytest.raises(Exception, match="worker exited"):
            group.collect("killed save", timeout_s=120)
    with lab_page(lab.url("status")) as page:
        status = page.locator(".nbckpt-statusbar")
        expect(status).to_have_text("Checkpoint: 1 failed", timeout=30_000)
        # Clicking it shows the root where it failed.
        status.click()
        sidebar = page.locator("#nbckpt-sidebar")
        expect(sidebar.locator(".nbckpt-root-input")).to_have_value("live")
        expect(sidebar.locator(".nbckpt-op .nbckpt-badge-failed")).to_have_count(1)
        page.screenshot(path=ARTIFACTS / "lab_statusbar_failed.png")
