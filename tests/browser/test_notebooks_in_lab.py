"""The teaching notebooks 01 and 04, run as a learner runs them: in JupyterLab, in Chromium.

Each notebook is copied into the server's root and opened in JupyterLab, and all its
cells run from the command palette; each makes its checkpoint root next to itself,
where the Checkpoints sidebar may open it. Once every code cell has its execution
count, the test checks that

* no cell shows a traceback, on the page or in the saved notebook;
* every progress widget on the page draws what the operation's merged journal says,
  read from disk by the test itself (``read_operation`` then ``view_state`` and
  ``rows_from_view``): the operation's status in the frame, the badge, the table and
  the timeline, and per process its status, phase, bytes, barrier chips, end text and
  error. Notebook 04's failed save must show process 2, which the notebook kills, as
  dead and the survivors as failed;
* the sidebar, opened on the notebook's root, gives each of those operations the same
  status, and shows the timeline of the one it selects;
* in JupyterLab Light and again in JupyterLab Dark (switched from the palette, without a
  rerun), nothing in a widget is clipped or scrolls sideways, and every text of a
  widget (its table, title, badge and chips; not the timeline's SVG labels) stands out
  from its ground (contrast at least 3).

Live figures hold times and sizes that change from run to run, so the screenshots of
each widget and of the sidebar, in both themes, are kept in ``artifacts/``
(``nb01_save_step1_light.png``, ``nb04_failed_save_step3_dark.png``,
``nb04_sidebar_dark.png``, ...) for people to look at, not compared with references.
"""

from __future__ import annotations

import re
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nbformat
import pytest

from nbckpt.journal import read_operation
from nbckpt.protocol import END_STATUS, Kind, Status
from nbckpt.views.monitor import OperationView, settled, view_state
from nbckpt.widgets.progress import rows_from_view, title_of
from tests.browser.labserver import ARTIFACTS, REPO, lab_page, run_command, running_lab
from tests.browser.screens import DARK_THEME, contrast

pytestmark = [pytest.mark.browser, pytest.mark.multihost]

NOTEBOOKS = REPO / "notebooks"
LIGHT_THEME = "JupyterLab Light"
#: How long the notebook may take to run every cell, on a loaded machine.
RUN_TIMEOUT_MS = 240_000


@dataclass(frozen=True)
class Lab:
    """A running JupyterLab: its URL and token, and the folder it serves."""

    base: str
    token: str
    root: Path
    #: The server's log (``lab.log`` in its home).
    log: Path

    def url(self, notebook: str) -> str:
        """The notebook opened in a workspace of its own."""
        workspace = Path(notebook).stem
        return f"{self.base}/lab/workspaces/{workspace}/tree/{notebook}?token={self.token}"


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    """One JupyterLab for both notebooks, serving a folder with copies of them."""
    root = tmp_path_factory.mktemp("notebooks-lab")
    for name in ("01_quickstart.ipynb", "04_atomicity_and_failures.ipynb"):
        shutil.copyfile(NOTEBOOKS / name, root / name)
    home = tmp_path_factory.mktemp("jupyter-home")
    with running_lab(root, home) as (base, token):
        yield Lab(base, token, root, home / "lab.log")


# -- running a notebook ---------------------------------------------------------------

ALL_RAN = """([codeCells, cells]) => {
    const errors = document.querySelectorAll(
        '.jp-RenderedText[data-mime-type="application/vnd.jupyter.error"]');
    const idle = document.querySelector(
        ".jp-Notebook-ExecutionIndicator[data-status='idle']") !== null;
    const prompts = [...document.querySelectorAll(
        '.jp-Notebook .jp-CodeCell .jp-InputArea-prompt')];
    const counted = prompts.filter(p => /^\\[\\d+\\]:$/.test(p.textContent.trim()));
    const shown = document.querySelectorAll('.jp-Notebook .jp-Cell').length;
    return idle && shown === cells && (counted.length === codeCells || errors.length > 0);
}"""


def _run_all(page: Any, path: Path) -> None:
    """Run every cell of the open notebook; return when the kernel is idle again."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeoutError
    from playwright.sync_api import expect

    nb = nbformat.read(path, as_version=4)
    code = sum(c.cell_type == "code" for c in nb.cells)
    expect(page.locator(".jp-Notebook .jp-Cell")).to_have_count(len(nb.cells), timeout=60_000)
    indicator = page.locator(".jp-Notebook-ExecutionIndicator[data-status='idle']")
    expect(indicator).to_have_count(1, timeout=60_000)
    run_command(page, "Run All Cells")
    # Before the run no code cell has a count and no cell an error: no stale "done".
    try:
        page.wait_for_function(ALL_RAN, arg=[code, len(nb.cells)], timeout=RUN_TIMEOUT_MS)
    except PlaywrightTimeoutError:
        page.screenshot(path=ARTIFACTS / f"{path.stem}_unfinished.png")
        prompts = page.locator(".jp-Notebook .jp-CodeCell .jp-InputArea-prompt")
        # Run All stops at a cell that raised: say what it raised, or the failure
        # cannot be told from a slow kernel.
        errors = page.locator(
            ".jp-Notebook .jp-RenderedText[data-mime-type='application/vnd.jupyter.stderr']"
        ).all_inner_texts()
        raise AssertionError(
            f"{path.name} did not finish within {RUN_TIMEOUT_MS / 1000:.0f} s; prompts: "
            f"{prompts.all_inner_texts()}, kernel: {_kernel_status(page)}; "
            f"error outputs: {[e[-1500:] for e in errors]}"
        ) from None


def _kernel_status(page: Any) -> str | None:
    status: str | None = page.locator(".jp-Notebook-ExecutionIndicator").first.get_attribute(
        "data-status"
    )
    return status


def _tracebacks(page: Any) -> list[str]:
    errors = page.locator('.jp-RenderedText[data-mime-type="application/vnd.jupyter.error"]')
    texts: list[str] = errors.all_inner_texts()
    return texts


def _saved_outputs(page: Any, path: Path) -> list[Any]:
    """Save the notebook from the page; return the outputs of its code cells, from disk."""
    run_command(page, "Save Notebook")
    deadline = 60_000
    while deadline > 0:
        try:
            nb = nbformat.read(path, as_version=4)
        except nbformat.reader.NotJSONError:
            nb = None  # read while the server writes it
        code = [c for c in nb.cells if c.cell_type == "code"] if nb else []
        if code and all(c.execution_count is not None for c in code):
            return [o for c in code for o in c.outputs]
        page.wait_for_timeout(250)
        deadline -= 250
    raise AssertionError(f"{path.name} was not saved with its outputs")


def _text_of(outputs: list[Any]) -> str:
    return "\n".join(
        str(o.get("text", "")) + str(o.get("data", {}).get("text/plain", "")) for o in outputs
    )


def _checkpoint_root(lab: Lab, prefix: str) -> Path:
    """The root the notebook made next to itself with ``mkdtemp(prefix=prefix, dir=".")``."""
    found = sorted(lab.root.glob(f"{prefix}*"))
    assert len(found) == 1, (prefix, found, sorted(lab.root.iterdir()))
    return found[0]


# -- what a widget draws, and what the journal says -----------------------------------

DRAWN = """el => {
    const text = n => (n ? n.textContent : null);
    const rows = [...el.querySelectorAll('tr.nbckpt-w-row')].map(tr => {
        const phase = tr.querySelector('.nbckpt-w-phase').cloneNode(true);
        phase.querySelectorAll('.nbckpt-w-note').forEach(n => n.remove());
        return {
            process: Number(tr.dataset.process),
            status: tr.dataset.status,
            status_text: text(tr.querySelector('.nbckpt-w-status')),
            phase: phase.textContent,
            bytes: text(tr.querySelector('.nbckpt-w-bytes-text')),
            barriers: [...tr.querySelectorAll('.nbckpt-w-barrier')].map(
                b => [b.dataset.name, b.dataset.state, b.textContent]),
            end: text(tr.querySelector('.nbckpt-w-when')),
        };
    });
    const svg = el.querySelector('svg.nbckpt-timeline');
    return {
        status: el.dataset.status,
        badge: text(el.querySelector('.nbckpt-w-badge')),
        table: el.querySelector('.nbckpt-w-table').dataset.status,
        timeline: svg ? svg.getAttribute('data-status') : null,
        title: text(el.querySelector('.nbckpt-w-title')).trim(),
        rows,
        errors: [...el.querySelectorAll('.nbckpt-w-error')].map(text),
    };
}"""


def _expected(view: OperationView) -> dict[str, Any]:
    """What :data:`DRAWN` must read from a widget that shows ``view``."""
    rows = rows_from_view(view)
    return {
        "status": view.status,
        "badge": view.status,
        "table": view.status,
        "timeline": view.status,
        "title": title_of(view),
        "rows": [
            {
                "process": r["process"],
                "status": r["status"],
                "status_text": r["status"],
                "phase": r["phase"],
                # A size never breaks between its number and its unit (progress.ts).
                "bytes": _no_break(r["bytes_text"]) if r["show_bytes"] else None,
                "barriers": [[b["name"], b["state"], b["text"]] for b in r["barriers"]],
                "end": r["end_text"],
            }
            for r in rows
        ],
        "errors": [f"process {r['process']}: {r['error']}" for r in rows if r["error"]],
    }


def _no_break(text: str) -> str:
    return re.sub(r"(\d) (?=[A-Za-z])", "\\1\u00a0", text)


def _widget_ops(page: Any) -> list[str]:
    """The operation ids of the progress widgets on the page, once all are known."""
    widgets = page.locator(".nbckpt-w")
    # A barrier's widget knows its op by a glob until the first process journals it.
    page.wait_for_function(
        """() => [...document.querySelectorAll('.nbckpt-w')]
            .every(w => w.dataset.op && !w.dataset.op.includes('*'))""",
        timeout=30_000,
    )
    ops: list[str] = [widgets.nth(i).get_attribute("data-op") for i in range(widgets.count())]
    return ops


def _journal_views(root: Path, ops: list[str]) -> dict[str, OperationView]:
    views = {op: view_state(read_operation(root, op)) for op in ops}
    # The notebook has run to its end: every journal shown must be final.
    assert all(settled(v) for v in views.values()), {op: v.status for op, v in views.items()}
    return views


def _agrees_with_journal(page: Any, op: str, view: OperationView) -> None:
    """Wait until the widget of ``op`` draws ``view``; fail with the difference if not."""
    widget = page.locator(f".nbckpt-w[data-op='{op}']")
    expected = _expected(view)
    drawn: dict[str, Any] = {}
    for _ in range(60):  # the last journal updates may still be on their way
        drawn = widget.evaluate(DRAWN)
        if drawn == expected:
            return
        page.wait_for_timeout(250)
    raise AssertionError(
        f"the widget of {op} disagrees with its journal:\n"
        + "\n".join(_differences(drawn, expected))
    )


def _differences(drawn: dict[str, Any], expected: dict[str, Any]) -> list[str]:
    """Each thing the widget draws otherwise than the journal says, in a line."""
    lines = []
    for key, want in expected.items():
        got = drawn.get(key)
        if key == "rows" and isinstance(got, list) and len(got) == len(want):
            for row, row_want in zip(got, want, strict=True):
                lines += [
                    f"process {row_want['process']} {field}: drawn {row.get(field)!r}, "
                    f"journal {value!r}"
                    for field, value in row_want.items()
                    if row.get(field) != value
                ]
        elif got != want:
            lines.append(f"{key}: drawn {got!r}, journal {want!r}")
    return lines


def _name(view: OperationView) -> str:
    """A screenshot's name for the widget of ``view``."""
    if view.kind == Kind.BARRIER:
        return f"barrier_{view.name}"
    failed = "failed_" if view.status == Status.FAILED else ""
    return f"{failed}{view.kind}_step{view.step}"


# -- layout and colours, in each theme ------------------------------------------------

CLIPPED = """el => {
    const name = n => `${n.tagName}.${n.getAttribute('class')}`;
    const out = el.closest('.jp-OutputArea-output') || el.parentElement;
    const right = Math.min(el.getBoundingClientRect().right,
                           out.getBoundingClientRect().right);
    const found = [];
    for (const n of [el, ...el.querySelectorAll('*')]) {
        if (n.getBoundingClientRect().right > right + 1) {
            found.push(`${name(n)} ends at ${n.getBoundingClientRect().right} > ${right}`);
        }
    }
    for (const n of [out, el, ...el.querySelectorAll('.nbckpt-w-scroll, td, th')]) {
        if (n.scrollWidth > n.clientWidth + 1) {
            found.push(`${name(n)} overflows: ${n.scrollWidth} > ${n.clientWidth}`);
        }
    }
    const table = el.querySelector('.nbckpt-w-table');
    if (table.scrollWidth > table.parentElement.clientWidth + 1) {
        found.push(`the table is ${table.scrollWidth} px in ${table.parentElement.clientWidth}`);
    }
    return found;
}"""

#: Every element of a widget with text of its own: its text colour, and the colour it is
#: painted on (its own background, or the first opaque one behind it, blended). Colours
#: go through a canvas, so whatever syntax the computed style has, rgba() comes out.
COLOURS = """el => {
    const canvas = document.createElement('canvas');
    canvas.width = canvas.height = 1;
    const ctx = canvas.getContext('2d', {willReadFrequently: true});
    const rgba = css => {
        ctx.clearRect(0, 0, 1, 1);
        ctx.fillStyle = '#000';
        ctx.fillStyle = css;
        ctx.fillRect(0, 0, 1, 1);
        const [r, g, b, a] = ctx.getImageData(0, 0, 1, 1).data;
        return [r, g, b, a / 255];
    };
    const ground = node => {
        const layers = [];
        for (let n = node; n; n = n.parentElement) {
            const c = rgba(getComputedStyle(n).backgroundColor);
            if (c[3] > 0) layers.push(c);
            if (c[3] >= 1) break;
        }
        let [r, g, b] = [255, 255, 255];
        for (const [lr, lg, lb, la] of layers.reverse()) {
            [r, g, b] = [lr * la + r * (1 - la), lg * la + g * (1 - la), lb * la + b * (1 - la)];
        }
        return `rgb(${r}, ${g}, ${b})`;
    };
    const css = ([r, g, b, a]) => `rgba(${r}, ${g}, ${b}, ${a})`;
    const found = [];
    for (const n of el.querySelectorAll('*')) {
        const own = [...n.childNodes].some(
            c => c.nodeType === Node.TEXT_NODE && c.textContent.trim());
        if (!own || n.closest('svg')) continue;
        const style = getComputedStyle(n);
        if (style.visibility === 'hidden' || style.display === 'none') continue;
        found.push([`${n.className} "${n.textContent.trim().slice(0, 40)}"`,
                    css(rgba(style.color)), ground(n)]);
    }
    return found;
}"""


def _check_looks(page: Any, op: str, theme: str) -> None:
    """Nothing of the widget is clipped, and all its text stands out from its ground."""
    widget = page.locator(f".nbckpt-w[data-op='{op}']")
    widget.scroll_into_view_if_needed()
    widget.locator("svg.nbckpt-timeline").wait_for()
    page.mouse.move(0, 0)  # no hover state in the picture
    page.wait_for_timeout(300)  # the bars' width transition
    assert widget.evaluate(CLIPPED) == [], (op, theme)
    colours: list[list[str]] = widget.evaluate(COLOURS)
    checked = " ".join(what for what, _, _ in colours)
    for part in ("nbckpt-w-badge", "nbckpt-w-status", "nbckpt-w-barrier", "nbckpt-w-title"):
        assert part in checked, (part, op, theme)
    faint = [
        (what, colour, ground, round(contrast(colour, ground), 2))
        for what, colour, ground in colours
        if contrast(colour, ground) < 3
    ]
    assert faint == [], (op, theme)


def _use_theme(page: Any, theme: str) -> None:
    """Switch JupyterLab's theme from the command palette; wait until it is applied."""
    from playwright.sync_api import expect

    body = page.locator("body")
    if body.get_attribute("data-jp-theme-name") == theme:
        return
    run_command(page, f"Use Theme: {theme}")
    expect(body).to_have_attribute("data-jp-theme-name", theme, timeout=30_000)
    page.wait_for_timeout(500)  # the widgets' CSS variables, and their transitions


def _sidebar(page: Any, root: str) -> Any:
    """The Checkpoints sidebar, opened by its tab on ``root``."""
    from playwright.sync_api import expect

    sidebar = page.locator("#nbckpt-sidebar")
    if not sidebar.is_visible():
        page.locator(".lm-TabBar-tab[data-id='nbckpt-sidebar']").click()
    expect(sidebar).to_be_visible()
    root_input = sidebar.locator(".nbckpt-root-input")
    if root_input.input_value() != root:
        root_input.fill(root)
        sidebar.locator(".nbckpt-root-open").click()
    return sidebar


def _collapse_left_area(page: Any) -> None:
    """Collapse the left area (the file browser, or the sidebar), so the notebook is wide."""
    from playwright.sync_api import expect

    current = page.locator(".jp-SideBar.jp-mod-left .lm-TabBar-tab.lm-mod-current")
    if current.count():
        current.click()
        expect(current).to_have_count(0)


def _sidebar_agrees(page: Any, lab: Lab, ckpt: Path, views: dict[str, OperationView]) -> Any:
    """Open the sidebar on ``ckpt``; each op's badge there says what its journal says."""
    from playwright.sync_api import expect

    sidebar = _sidebar(page, str(ckpt.relative_to(lab.root)))
    for op, view in views.items():
        badge = sidebar.locator(f"li.nbckpt-op[data-op='{op}'] .nbckpt-badge")
        expect(badge).to_have_class(f"nbckpt-badge nbckpt-badge-{view.status}", timeout=30_000)
    return sidebar


def _in_both_themes(
    page: Any, lab: Lab, notebook: str, ckpt: Path, views: dict[str, OperationView], show: str
) -> None:
    """Check and photograph every widget, then the sidebar showing ``show``, per theme."""
    from playwright.sync_api import expect

    for theme, label in (("light", LIGHT_THEME), ("dark", DARK_THEME)):
        _collapse_left_area(page)
        _use_theme(page, label)
        for op, view in views.items():
            _agrees_with_journal(page, op, view)  # a theme change redraws nothing wrong
            _check_looks(page, op, theme)
            widget = page.locator(f".nbckpt-w[data-op='{op}']")
            widget.screenshot(path=ARTIFACTS / f"{notebook}_{_name(view)}_{theme}.png")
        sidebar = _sidebar_agrees(page, lab, ckpt, views)
        item = sidebar.locator(f"li.nbckpt-op[data-op='{show}']")
        if "nbckpt-selected" not in (item.get_attribute("class") or ""):
            item.click()
        section = sidebar.locator(".nbckpt-timeline-section")
        expect(section.locator(f".nbckpt-badge-{views[show].status}")).to_be_visible()
        expect(section.locator(".nbckpt-timeline-row")).to_have_count(len(views[show].processes))
        page.mouse.move(0, 0)
        sidebar.screenshot(path=ARTIFACTS / f"{notebook}_sidebar_{theme}.png")
        page.screenshot(path=ARTIFACTS / f"{notebook}_lab_{theme}.png")


def _run_and_read(
    page: Any, lab: Lab, name: str, says: list[str], prefix: str
) -> tuple[Path, dict[str, OperationView]]:
    """Run a notebook, check it raised nothing and printed ``says``; its root and views.

    The views are those of the operations whose widgets the page shows, rebuilt from
    the journal under the notebook's checkpoint root (``prefix*``).
    """
    path = lab.root / name
    _use_theme(page, LIGHT_THEME)
    _run_all(page, path)
    assert _tracebacks(page) == []
    outputs = _saved_outputs(page, path)
    assert [o for o in outputs if o.output_type == "error"] == []
    text = _text_of(outputs)
    for line in says:
        assert line in text
    ckpt = _checkpoint_root(lab, prefix)
    return ckpt, _journal_views(ckpt, _widget_ops(page))


# -- the tests ------------------------------------------------------------------------


def test_quickstart_widgets_tell_what_the_journal_says(lab: Lab) -> None:
    with lab_page(lab.url("01_quickstart.ipynb")) as page:
        ckpt, views = _run_and_read(
            page,
            lab,
            "01_quickstart.ipynb",
            ["restored state is identical", "cluster stopped"],
            "ckpt-quickstart-",
        )
        shown = sorted(((v.kind, v.step, v.status) for v in views.values()), key=str)
        # A barrier is released, a save committed.
        assert shown == [(Kind.BARRIER, None, Status.RELEASED), (Kind.SAVE, 1, Status.COMMITTED)]
        for op, view in views.items():
            _agrees_with_journal(page, op, view)
            assert {p.status for p in view.processes} == {END_STATUS[view.kind]}
        save = next(op for op, v in views.items() if v.kind == Kind.SAVE)
        _in_both_themes(page, lab, "nb01", ckpt, views, show=save)


def test_failures_widgets_tell_what_the_journal_says(lab: Lab) -> None:
    with lab_page(lab.url("04_atomicity_and_failures.ipynb")) as page:
        ckpt, views = _run_and_read(
            page,
            lab,
            "04_atomicity_and_failures.ipynb",
            ["process 2 died", "step 2 restored intact on all 4 processes"],
            "ckpt-failures-",
        )
        shown = sorted(((v.kind, v.step, v.status) for v in views.values()), key=str)
        assert shown == [
            (Kind.SAVE, 1, Status.COMMITTED),
            (Kind.SAVE, 2, Status.COMMITTED),
            (Kind.SAVE, 3, Status.FAILED),
        ]
        # What the notebook teaches, as its journal has it: process 2 was killed at its
        # write, and the other three gave up.
        failed = next(op for op, v in views.items() if v.status == Status.FAILED)
        statuses = {p.process: p.status for p in views[failed].processes}
        assert statuses == {0: Status.FAILED, 1: Status.FAILED, 2: Status.DEAD, 3: Status.FAILED}
        for op, view in views.items():
            _agrees_with_journal(page, op, view)
        # The same, read from the page: the dead process is dead, the others failed.
        widget = page.locator(f".nbckpt-w[data-op='{failed}']")
        for p, status in statuses.items():
            row = widget.locator(f"tr.nbckpt-w-row[data-process='{p}']")
            assert row.get_attribute("data-status") == status
            assert row.locator(".nbckpt-w-status").text_content() == status
        assert widget.locator(".nbckpt-w-badge").text_content() == Status.FAILED
        _in_both_themes(page, lab, "nb04", ckpt, views, show=failed)
    # Two notebooks started and stopped three clusters, one of whose processes was
    # killed: the server's log holds none of their output (the review counted 2,755
    # lines: ipyparallel's server extension adopted each cluster and logged it).
    log = lab.log.read_text(errors="replace")
    assert "Output for" not in log and "Traceback" not in log
    assert "Monitor message" not in log
