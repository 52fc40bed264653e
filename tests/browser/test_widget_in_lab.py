"""The live progress widget in a real JupyterLab, driven by Playwright in Debian's Chromium.

A notebook starts a 2-engine cluster, builds a small sharded state with ``%%px``, makes
process 1 stall 2 s before the ``write_complete`` barrier and runs ``%ckpt_save``; the next
cell keeps the kernel busy. Without any cell run for it, the page must show a barrier
wait, then every process's row reach "committed" while that cell still runs. The
screenshot is kept in ``artifacts/``.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import nbformat
import pytest

from tests.browser.labserver import ARTIFACTS, lab_page, run_command, running_lab

pytestmark = [pytest.mark.browser, pytest.mark.multihost]

CELLS = [
    "%load_ext nbckpt\n%ckpt_cluster start -n 2 --dir ckpt",
    "%%px\n"
    "import jax, numpy as np\n"
    "from jax.sharding import Mesh, NamedSharding, PartitionSpec as P\n"
    "mesh = Mesh(np.array(jax.devices()), ('data',))\n"
    "state = {'w': jax.make_array_from_callback((512, 256), NamedSharding(mesh, P('data')),\n"
    "                                           lambda idx: np.ones((512, 256), np.float32)[idx])}",
    "%%px\nfrom nbckpt.engine import faults\n"
    "if jax.process_index() == 1:\n    faults.stall('barrier:write_complete', 2.0)",
    "h = %ckpt_save state --step 1",
    "import time\ntime.sleep(10)\nprint('slept')",
    "%ckpt_cluster stop",
]
BUSY = 4  # the cell that keeps the kernel busy while the save commits


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """JupyterLab serving a folder with ``live.ipynb``; yields its URL and the folder."""
    root = tmp_path_factory.mktemp("widget-lab")
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in CELLS])
    nb.metadata["kernelspec"] = {
        "name": "python3",
        "display_name": "Python 3",
        "language": "python",
    }
    nbformat.write(nb, root / "live.ipynb")
    with running_lab(root, tmp_path_factory.mktemp("jupyter-home")) as (base, token):
        yield f"{base}/lab/tree/live.ipynb?token={token}", root


def test_save_widget_reaches_committed_on_every_row(lab: tuple[str, Path]) -> None:
    from playwright.sync_api import expect

    url, root = lab
    with lab_page(url) as page:
        cells = page.locator(".jp-Notebook .jp-Cell")
        expect(cells).to_have_count(len(CELLS), timeout=60_000)
        expect(page.locator(".jp-Notebook-ExecutionIndicator[data-status='idle']")).to_have_count(
            1, timeout=60_000
        )
        # Run every cell above the last one (which stops the cluster).
        cells.nth(len(CELLS) - 1).locator(".jp-InputArea-prompt").click()
        run_command(page, "Run All Above Selected Cell")

        widget = page.locator(".nbckpt-w")
        expect(widget).to_be_visible(timeout=90_000)
        rows = widget.locator("tr.nbckpt-w-row")
        expect(rows).to_have_count(2)
        # Process 0 waits 2 s for process 1 at write_complete; meanwhile a cell keeps
        # the kernel busy. The rows still reach "committed" by themselves before it ends.
        busy = cells.nth(BUSY).locator(".jp-InputArea-prompt")
        waiting = widget.locator(".nbckpt-w-barrier[data-state='waiting']")
        expect(waiting.first).to_have_text(
            re.compile(r"write_complete \+\d+ ms, waiting for 1"), timeout=60_000
        )
        page.screenshot(path=ARTIFACTS / "lab_widget_waiting.png")
        for p in (0, 1):
            status = widget.locator(f"tr.nbckpt-w-row[data-process='{p}'] .nbckpt-w-status")
            expect(status).to_have_text("committed", timeout=12_000)
        expect(busy).to_have_text("[*]:")
        expect(widget.locator(".nbckpt-w-badge")).to_have_text("committed")
        expect(widget.locator(".nbckpt-w-barrier[data-state='released']")).to_have_count(6)
        widget.scroll_into_view_if_needed()
        page.screenshot(path=ARTIFACTS / "lab_widget_committed.png")
        expect(page.locator(".jp-OutputArea-output", has_text="slept")).to_be_visible(
            timeout=30_000
        )

        # Leave no engines behind: run the last cell.
        cells.nth(len(CELLS) - 1).locator(".jp-InputArea-prompt").click()
        run_command(page, "Run Selected Cell")
        expect(page.locator(".jp-OutputArea-output", has_text="cluster stopped")).to_be_visible(
            timeout=60_000
        )
    assert (root / "ckpt" / "1").is_dir()
