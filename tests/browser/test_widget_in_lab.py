"""The progress widget in a real JupyterLab, driven by Playwright in Debian's Chromium.

Two kinds of check:

* **Pictures**, from scripted journals (a committed save and a failed one, written with
  the real journal writer at fixed times, so every time and byte count is the same on
  each run): the widget is shown in JupyterLab Light and JupyterLab Dark, at a notebook
  width of about 500 px (the file browser open beside it) and a wide one, and each
  screenshot of the widget is compared with a committed reference
  (``tests/browser/references``; ``tests/browser/screens.py``). In the browser the test
  also checks that nothing is clipped at the narrow width and that the barrier chips'
  text stands out from their ground in the dark theme.
* **Behaviour**, from a live save: a notebook starts a 2-engine cluster, makes process 1
  stall 2 s before the ``write_complete`` barrier and runs ``%ckpt_save``; the next cell
  keeps the kernel busy. Without any cell run for it, the widget must show the barrier
  wait (in its table and, hatched and growing, in its timeline), then every row reach
  "committed" and the timeline its commit marker while that cell still runs.

Screenshots are kept in ``artifacts/``.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.browser.labserver import (
    ARTIFACTS,
    lab_page,
    run_command,
    running_lab,
    write_notebook,
)
from tests.browser.screens import DARK_THEME, compare, contrast, set_lab_theme
from tests.journal_scripts import SAVE, failing_save, many_save, write_script

pytestmark = [pytest.mark.browser]

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

#: Scripted journals under ``journals/`` of the server root, shown by ``show(op)``:
#: two of 2 processes, and one of 1,024 (process 17 a straggler), shown as a whole.
SCRIPTED = {"committed": SAVE, "failed": failing_save(), "many": many_save()}
#: The rows each widget keeps: every process, or above 16 only those that matter.
ROWS = {"committed": 2, "failed": 2, "many": 8}
SCRIPTED_CELLS = [
    "from nbckpt.journal import read_operation\n"
    "from nbckpt.views.monitor import view_state\n"
    "from nbckpt.widgets import ProgressWidget\n"
    "\n"
    "def show(op):\n"
    "    record = read_operation('journals', op)\n"
    "    return ProgressWidget(view_state(record), record)",
    *[f"show({op!r})" for op in SCRIPTED],
]
#: A viewport in which the notebook, beside the open file browser, leaves a widget
#: about 500 px wide; and a wide one.
NARROW = {"width": 930, "height": 1000}
WIDE = {"width": 1500, "height": 1000}
#: The 1,024-process widget is taller than those viewports: its pictures are taken in
#: a taller one of the same width, so that all of it is on screen.
TALL = 2400


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """JupyterLab serving a folder with ``live.ipynb``; yields its URL and the folder."""
    root = tmp_path_factory.mktemp("widget-lab")
    write_notebook(root / "live.ipynb", CELLS)
    with running_lab(root, tmp_path_factory.mktemp("jupyter-home")) as (base, token):
        yield f"{base}/lab/tree/live.ipynb?token={token}", root


@pytest.fixture(scope="module", params=["light", "dark"])
def scripted_lab(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, str]]:
    """JupyterLab in one theme, serving ``scripted.ipynb``; yields its URL and the theme."""
    theme: str = request.param
    root = tmp_path_factory.mktemp(f"scripted-{theme}")
    for op, script in SCRIPTED.items():
        write_script(root / "journals", op, script)
    write_notebook(root / "scripted.ipynb", SCRIPTED_CELLS)
    home = tmp_path_factory.mktemp(f"jupyter-home-{theme}")
    if theme == "dark":
        set_lab_theme(home / "settings", DARK_THEME)
    with running_lab(root, home) as (base, token):
        yield f"{base}/lab/tree/scripted.ipynb?token={token}", theme


def _settle(page: Any, widget: Any) -> None:
    """Wait until the widget's timeline is drawn at the widget's current width."""
    widget.locator("svg.nbckpt-timeline").wait_for()
    widget.evaluate(
        """el => new Promise(resolve => {
            const ok = () => {
                const chart = el.querySelector('.nbckpt-w-timeline');
                const svg = chart.querySelector('svg');
                return svg && Number(svg.getAttribute('width')) === chart.clientWidth;
            };
            const poll = () => (ok() ? resolve(true) : setTimeout(poll, 50));
            poll();
        })"""
    )
    page.mouse.move(0, 0)  # no hover state in the picture
    page.wait_for_timeout(300)  # the bars' width transition


def _clipping(widget: Any) -> list[str]:
    """What of the widget sticks out of it, or of the output area, or scrolls sideways."""
    found: list[str] = widget.evaluate(
        """el => {
            const name = n => `${n.tagName}.${n.getAttribute('class')}`;
            const out = el.closest('.jp-OutputArea-output') || el.parentElement;
            const right = Math.min(el.getBoundingClientRect().right,
                                   out.getBoundingClientRect().right);
            const found = [el, ...el.querySelectorAll('*')]
                .filter(n => n.getBoundingClientRect().right > right + 1)
                .map(n => `${name(n)} ends at ${n.getBoundingClientRect().right} > ${right}`);
            for (const n of [out, el, ...el.querySelectorAll('.nbckpt-w-scroll')]) {
                if (n.scrollWidth > n.clientWidth + 1) {
                    found.push(`${name(n)} scrolls: ${n.scrollWidth} > ${n.clientWidth}`);
                }
            }
            return found;
        }"""
    )
    return found


def test_scripted_widgets_look_as_their_references(scripted_lab: tuple[str, str]) -> None:
    from playwright.sync_api import expect

    url, theme = scripted_lab
    with lab_page(url) as page:
        page.set_viewport_size(NARROW)
        cells = page.locator(".jp-Notebook .jp-Cell")
        expect(cells).to_have_count(len(SCRIPTED_CELLS), timeout=60_000)
        expect(page.locator(".jp-Notebook-ExecutionIndicator[data-status='idle']")).to_have_count(
            1, timeout=60_000
        )
        expect(page.locator("body")).to_have_attribute(
            "data-jp-theme-light", "false" if theme == "dark" else "true"
        )
        run_command(page, "Run All Cells")
        for op in SCRIPTED:
            widget = page.locator(f".nbckpt-w[data-op='{op}']")
            expect(widget).to_be_visible(timeout=60_000)
            expect(widget.locator("tr.nbckpt-w-row")).to_have_count(ROWS[op])

        committed = page.locator(".nbckpt-w[data-op='committed']")
        failed = page.locator(".nbckpt-w[data-op='failed']")
        # The shared timeline: one row per process, hatched waits naming whom they
        # waited for, the commit marker; the failed save's spans outlined in red.
        chart = committed.locator("svg.nbckpt-timeline")
        expect(chart.locator(".nbckpt-timeline-row")).to_have_count(2)
        expect(chart.locator(".nbckpt-commit")).to_have_count(1)
        waited = chart.locator(
            ".nbckpt-timeline-row[data-process='0'] "
            "rect.nbckpt-span-barrier[data-phase='barrier:write_complete']"
        )
        expect(waited).to_have_attribute("data-waited-for", "1")
        expect(chart.locator(".nbckpt-barrier-label").first).to_be_attached()
        expect(failed.locator("rect.nbckpt-span-failed")).to_have_count(2)
        expect(failed.locator("svg .nbckpt-commit")).to_have_count(0)
        expect(failed.locator(".nbckpt-w-error")).to_have_count(2)
        # 1,024 processes: the job as a whole, the straggler first among 8 rows and lanes.
        many = page.locator(".nbckpt-w[data-op='many']")
        expect(many.locator(".nbckpt-summary-headline")).to_have_text("1,024 of 1,024 committed")
        expect(many.locator(".nbckpt-summary-spread")).to_have_count(3)
        spread = many.locator(
            ".nbckpt-summary-spread[data-name='tmp_ready'] .nbckpt-summary-spread-text"
        )
        expect(spread).to_contain_text("last: 17 (+2,017\u00a0ms)")
        expect(many.locator(".nbckpt-summary-hist").first.locator("rect")).not_to_have_count(0)
        expect(many.locator("tr.nbckpt-w-row").first).to_have_attribute("data-process", "17")
        expect(many.locator("svg .nbckpt-timeline-row")).to_have_count(8)
        expect(committed.locator(".nbckpt-summary")).to_be_hidden()

        for op in SCRIPTED:
            page.set_viewport_size({**NARROW, "height": TALL if op == "many" else 1000})
            widget = page.locator(f".nbckpt-w[data-op='{op}']")
            widget.scroll_into_view_if_needed()
            _settle(page, widget)
            width = widget.evaluate("el => el.clientWidth")
            assert 380 <= width <= 560, width  # a narrow notebook, as with the sidebar open
            # Nothing clipped and no sideways scrolling: every column wraps instead.
            assert _clipping(widget) == []
            table = widget.locator(".nbckpt-w-table")
            assert table.evaluate("t => t.scrollWidth <= t.parentElement.clientWidth")
            shot = ARTIFACTS / f"widget_{op}_{theme}_narrow.png"
            widget.screenshot(path=shot, animations="disabled")
            compare(shot, shot.name)

        # Theme colours: chip text always stands out from its ground (it was white on
        # white in the dark theme), and the timeline's write colour is the theme's.
        chip = committed.locator(".nbckpt-w-barrier[data-state='released']").first
        colour, ground = chip.evaluate(
            "el => [getComputedStyle(el).color, getComputedStyle(el).backgroundColor]"
        )
        assert colour != ground
        assert contrast(colour, ground) >= 4.5, (colour, ground)
        write = chart.locator("rect.nbckpt-span-write").first.evaluate(
            "el => getComputedStyle(el).fill"
        )
        brand = page.evaluate(
            "getComputedStyle(document.body).getPropertyValue('--jp-brand-color1').trim()"
        )
        expected = {"light": "rgb(25, 118, 210)", "dark": "rgb(33, 150, 243)"}[theme]
        assert write == expected, (write, brand)

        for op in SCRIPTED:
            page.set_viewport_size({**WIDE, "height": TALL if op == "many" else 1000})
            widget = page.locator(f".nbckpt-w[data-op='{op}']")
            widget.scroll_into_view_if_needed()
            _settle(page, widget)
            assert _clipping(widget) == []
            shot = ARTIFACTS / f"widget_{op}_{theme}_wide.png"
            widget.screenshot(path=shot, animations="disabled")
            compare(shot, shot.name)
        page.screenshot(path=ARTIFACTS / f"lab_widget_scripted_{theme}.png")

        # The field under the summary asks for any other process: Python adds its row
        # and its lane (the straggler's stay first).
        many = page.locator(".nbckpt-w[data-op='many']")
        many.locator(".nbckpt-process-input").fill("500")
        many.locator(".nbckpt-process-open").click()
        expect(many.locator("tr.nbckpt-w-row[data-process='500']")).to_have_count(1)
        expect(many.locator("tr.nbckpt-w-row")).to_have_count(ROWS["many"] + 1)
        expect(many.locator("tr.nbckpt-w-row").first).to_have_attribute("data-process", "17")
        expect(many.locator("svg .nbckpt-timeline-row[data-process='500']")).to_have_count(1)


def _axis_end(widget: Any) -> float:
    text = widget.locator("svg.nbckpt-timeline .nbckpt-timeline-axis").last.text_content()
    found = re.match(r"(\d+) ms", text or "")
    assert found, text
    return float(found.group(1))


@pytest.mark.multihost
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
        # The timeline shows the open wait, whom it waits for, and grows while it lasts.
        open_wait = widget.locator(
            "svg .nbckpt-timeline-row[data-process='0'] "
            "rect.nbckpt-span-open[data-phase='barrier:write_complete']"
        )
        expect(open_wait).to_have_attribute("data-waited-for", "1")
        before = _axis_end(widget)
        page.wait_for_timeout(1_000)
        assert _axis_end(widget) > before  # grown to "now", or to the commit since
        page.screenshot(path=ARTIFACTS / "lab_widget_waiting.png")
        widget.screenshot(path=ARTIFACTS / "widget_live_waiting.png")
        for p in (0, 1):
            status = widget.locator(f"tr.nbckpt-w-row[data-process='{p}'] .nbckpt-w-status")
            expect(status).to_have_text("committed", timeout=12_000)
        expect(busy).to_have_text("[*]:")
        expect(widget.locator(".nbckpt-w-badge")).to_have_text("committed")
        expect(widget.locator(".nbckpt-w-barrier[data-state='released']")).to_have_count(6)
        expect(widget.locator("svg.nbckpt-timeline[data-status='committed']")).to_be_visible()
        expect(widget.locator("svg .nbckpt-commit")).to_have_count(1)
        expect(widget.locator("svg rect.nbckpt-span-open")).to_have_count(0)
        widget.scroll_into_view_if_needed()
        page.screenshot(path=ARTIFACTS / "lab_widget_committed.png")
        widget.screenshot(path=ARTIFACTS / "widget_live_committed.png")
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
