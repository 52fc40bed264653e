"""The Checkpoints sidebar on a bucket root, in a real JupyterLab and Chromium.

A local S3 server (moto on 127.0.0.1) holds one committed step; JupyterLab runs with
that store's credentials in its environment, so its routes may read the bucket. The
test types the ``s3://`` root into the sidebar, checks the step (complete, size "—")
and its timeline read from the journal objects, then asks for a bucket that does not
exist and checks the one-line error. Screenshots go to ``artifacts/``.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from nbckpt.engine import AsyncCheckpointer
from nbckpt.formats.layout import all_steps
from nbckpt.storage.local_s3 import S3Server
from tests.browser.labserver import ARTIFACTS, lab_page, run_command, running_lab

pytestmark = [pytest.mark.browser, pytest.mark.multihost]

ROOT = "s3://lab-bucket/run"


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """JupyterLab with the S3 server's environment, and a bucket with step 1 in it."""
    with S3Server() as server, pytest.MonkeyPatch.context() as mp:
        server.create_bucket("lab-bucket")
        for key, value in server.env().items():
            mp.setenv(key, value)  # this process (the save) and the lab it starts
        ckptr = AsyncCheckpointer(ROOT)
        ckptr.save(1, {"w": np.arange(1024, dtype=np.float32)})
        ckptr.wait_until_finished()
        assert all_steps(ROOT) == [1]
        server_root: Path = tmp_path_factory.mktemp("lab-s3")
        home = tmp_path_factory.mktemp("jupyter-home-s3")
        with running_lab(server_root, home) as (base, token):
            yield f"{base}/lab?token={token}"


def test_sidebar_lists_a_bucket_root(lab: str) -> None:
    from playwright.sync_api import expect

    with lab_page(lab) as page:
        run_command(page, "Open Checkpoints Sidebar")
        sidebar = page.locator("#nbckpt-sidebar")
        expect(sidebar).to_be_visible()
        sidebar.locator(".nbckpt-root-input").fill(ROOT)
        sidebar.locator(".nbckpt-root-open").click()
        step = sidebar.locator(".nbckpt-steps tr.nbckpt-step[data-path='1']")
        expect(step.locator(".nbckpt-badge-complete")).to_have_text("complete")
        expect(step.locator(".nbckpt-size")).to_have_text("—")  # a listing gives no sizes
        expect(step.locator(".nbckpt-procs")).to_have_text("1")
        step.click()
        timeline = sidebar.locator(".nbckpt-timeline-section")
        expect(timeline.locator(".nbckpt-badge-committed")).to_be_visible()
        expect(timeline.locator(".nbckpt-timeline-row")).to_have_count(1)
        page.screenshot(path=ARTIFACTS / "lab_sidebar_s3.png")

        sidebar.locator(".nbckpt-root-input").fill("s3://no-such-bucket/run")
        sidebar.locator(".nbckpt-root-open").click()
        status = sidebar.locator(".nbckpt-status.nbckpt-error")
        expect(status).to_contain_text("bucket 'no-such-bucket' does not exist")
        page.screenshot(path=ARTIFACTS / "lab_sidebar_s3_error.png")
