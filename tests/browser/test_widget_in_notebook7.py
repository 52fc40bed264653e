"""The progress widget and the ``%ckpt_watch`` runs table in Notebook 7, in real Chromium.

Notebook 7 (the ``notebook`` package) runs the same extensions as JupyterLab in a shell
of its own, so this checks that nbckpt's front ends load and draw there too. From two
scripted journals (a committed save and a failed one, written with the real journal
writer), a notebook opened at ``/notebooks/<name>.ipynb`` and run with *Run > Run All
Cells* shows each save with the public API (``nbckpt.widgets.watch``) and every save
under the root with ``nbckpt.widgets.watch_runs``. In the light and in the dark theme
the test checks that:

* each widget renders, for its operation (``data-op``), with the badge and every
  process row's status the journal records;
* the failed save's error rows name the cause: process 1's ``OSError: disk on fire``,
  and process 0's ``gave up: process 1 failed``;
* the runs table lists both saves, newest first, each with its status and its op id;
* the widget's and the table's text stands out from what it is painted on.

Screenshots (``notebook7_widget_<theme>.png``, the page; ``notebook7_runs_<theme>.png``,
the table) are kept in ``artifacts/``.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from nbckpt.journal import read_operation
from nbckpt.protocol import new_op_id
from tests.browser.labserver import ARTIFACTS, lab_page, running_lab, write_notebook
from tests.browser.screens import DARK_THEME, contrast, set_lab_theme
from tests.journal_scripts import SAVE, T0, failing_save, write_script

pytestmark = [pytest.mark.browser]

#: The checkpoint root the journals are written under, relative to the server root
#: (which is the kernel's working directory).
JOURNALS = "journals"
#: Real op ids, not names like "committed": the runs table picks saves by id (a start
#: time, the kind, the step). The failed save is a minute newer, so it is listed first.
COMMITTED = new_op_id("save", 7, datetime.fromtimestamp(T0, UTC))
FAILED = new_op_id("save", 8, datetime.fromtimestamp(T0 + 60, UTC))
SCRIPTED = {COMMITTED: (SAVE, 7), FAILED: (failing_save(), 8)}
#: What each failed process's error row says after ``process N: ``.
ERRORS = {FAILED: {0: "gave up: process 1 failed", 1: "OSError: disk on fire"}}
CELLS = [
    "from nbckpt.widgets import watch, watch_runs",
    *[f"watch({JOURNALS!r}, {op!r}, display=False)" for op in SCRIPTED],
    f"runs = watch_runs({JOURNALS!r})",
]
THEMES = {"light": "JupyterLab Light", "dark": DARK_THEME}
#: The least contrast of each part's text over its ground. Plain text: WCAG AA's 4.5:1.
#: Text in the theme's status colours (the badge, white on it; a row's status, in it):
#: 3:1, AA for large text and what tells a legible status from a washed-out one,
#: because JupyterLab Light's own --jp-success-color1 (#388e3c) is 4.1:1 against white,
#: in Notebook 7 as in JupyterLab.
MIN_CONTRAST = {
    ".nbckpt-w-title": 4.5,
    ".nbckpt-w-badge": 3.0,
    "tr.nbckpt-w-row .nbckpt-w-status": 3.0,
}
#: Tall enough that both widgets and the table are on screen at once, for the picture.
VIEWPORT = {"width": 1400, "height": 2000}


@pytest.fixture(scope="module", params=list(THEMES))
def notebook7(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, Path, str]]:
    """Notebook 7 in one theme, serving ``scripted.ipynb``; yields its URL, root and theme."""
    theme: str = request.param
    root = tmp_path_factory.mktemp(f"notebook7-{theme}")
    for op, (script, step) in SCRIPTED.items():
        write_script(root / JOURNALS, op, script, step=step)
    write_notebook(root / "scripted.ipynb", CELLS)
    home = tmp_path_factory.mktemp(f"notebook7-home-{theme}")
    if theme == "dark":
        # Notebook 7 reads user settings from JUPYTERLAB_SETTINGS_DIR as JupyterLab
        # does, so the theme's settings file, written before the server starts, is the
        # theme the page opens with: no menu clicks racing the page's own startup.
        set_lab_theme(home / "settings", DARK_THEME)
    with running_lab(root, home, app="notebook") as (base, token):
        yield f"{base}/notebooks/scripted.ipynb?token={token}", root, theme


def run_all_cells(page: Any, attempts: int = 5) -> None:
    """Run every cell of the notebook through Notebook 7's *Run* menu.

    Right after loading, a click on the menu's item can miss: in early runs on a busy
    2-CPU machine, 3 runs of the notebook out of about 20 left every cell unqueued, one
    with a cell under the menu selected instead, as when the menu closes (the notebook
    taking the focus) between Playwright finding the item and clicking it. So each try
    checks that the cells were queued. A prompt turns to ``[*]:`` as soon as its cell is
    queued, before any kernel runs it, so 5 s without one means the click missed.
    """
    from playwright.sync_api import TimeoutError as PlaywrightTimeoutError
    from playwright.sync_api import expect

    menu = page.locator(".lm-MenuBar-itemLabel", has_text=re.compile(r"^Run$"))
    item = page.locator(".lm-Menu-itemLabel", has_text=re.compile(r"^Run All Cells$"))
    queued = page.locator("#main-panel .jp-InputArea-prompt", has_text=re.compile(r"\[(\*|\d+)\]"))
    for _ in range(attempts):
        try:
            menu.click(timeout=5_000)
            item.click(timeout=5_000)
            expect(queued.first).to_be_visible(timeout=5_000)
            return
        except (PlaywrightTimeoutError, AssertionError):
            page.keyboard.press("Escape")  # a menu left open would eat the next click
    raise TimeoutError("could not run 'Run All Cells' from Notebook 7's Run menu")


def _paint_contrast(locator: Any) -> tuple[float, str, str]:
    """The contrast of an element's text over the first opaque ground behind it.

    Returns the ratio, the text's colour and the ground's, as computed styles give them.
    """
    colour, ground = locator.evaluate(
        """el => {
            let n = el, bg = 'rgba(0, 0, 0, 0)';
            for (; n; n = n.parentElement) {
                bg = getComputedStyle(n).backgroundColor;
                const alpha = bg.match(/rgba\\([^)]*,\\s*([\\d.]+)\\)/);
                if (!alpha || Number(alpha[1]) > 0.5) break;
            }
            return [getComputedStyle(el).color, bg];
        }"""
    )
    return contrast(colour, ground), colour, ground


def test_widget_and_runs_table_in_notebook7(notebook7: tuple[str, Path, str]) -> None:
    from playwright.sync_api import expect

    url, root, theme = notebook7
    with lab_page(url, ready="#main-panel .jp-Notebook", viewport=VIEWPORT) as page:
        body = page.locator("body")
        expect(body).to_have_attribute("data-notebook", "notebooks")  # Notebook 7, not Lab
        expect(body).to_have_attribute("data-jp-theme-name", THEMES[theme])
        expect(body).to_have_attribute("data-jp-theme-light", str(theme == "light").lower())
        cells = page.locator("#main-panel .jp-Notebook .jp-Cell")
        expect(cells).to_have_count(len(CELLS), timeout=60_000)
        expect(page.locator(".jp-Notebook-ExecutionIndicator[data-status='idle']")).to_have_count(
            1, timeout=60_000
        )
        run_all_cells(page)

        for op in SCRIPTED:
            record = read_operation(root / JOURNALS, op)
            widget = page.locator(f".nbckpt-w[data-op='{op}']")
            expect(widget).to_be_visible(timeout=90_000)
            expect(widget.locator(".nbckpt-w-badge")).to_have_text(str(record.status))
            expect(widget.locator("tr.nbckpt-w-row")).to_have_count(len(record.processes))
            for p, proc in record.processes.items():
                row = widget.locator(f"tr.nbckpt-w-row[data-process='{p}']")
                expect(row).to_have_attribute("data-status", str(proc.status))
                expect(row.locator(".nbckpt-w-status")).to_have_text(str(proc.status))
            errors = ERRORS.get(op, {})
            expect(widget.locator(".nbckpt-w-error")).to_have_count(len(errors))
            for p, text in errors.items():
                # The error row follows the row of the process it belongs to.
                error = widget.locator(
                    f"tr.nbckpt-w-row[data-process='{p}'] + tr.nbckpt-w-error-row .nbckpt-w-error"
                )
                expect(error).to_have_text(f"process {p}: {text}")
            expect(widget.locator("svg.nbckpt-timeline")).to_have_attribute(
                "data-status", str(record.status)
            )
            for part, least in MIN_CONTRAST.items():
                ratio, colour, ground = _paint_contrast(widget.locator(part).first)
                assert ratio >= least, (theme, op, part, colour, ground)

        table = page.locator("table.nbckpt-runs")
        expect(table).to_be_visible(timeout=60_000)
        runs = table.locator("tr.run")
        expect(runs).to_have_count(len(SCRIPTED))
        for i, op in enumerate([FAILED, COMMITTED]):  # newest first
            run = runs.nth(i)
            expect(run).to_have_attribute("data-op", op)
            expect(run).to_have_attribute(
                "data-status", str(read_operation(root / JOURNALS, op).status)
            )
            expect(run.locator("td.op")).to_have_text(op)
        expect(table.locator("tr.error")).to_contain_text("process 1: OSError: disk on fire")
        ratio, colour, ground = _paint_contrast(table.locator("td.op code").first)
        assert ratio >= 4.5, (theme, colour, ground)

        page.mouse.move(0, 0)  # no hover state in the pictures
        table.screenshot(path=ARTIFACTS / f"notebook7_runs_{theme}.png")
        page.screenshot(path=ARTIFACTS / f"notebook7_widget_{theme}.png")
