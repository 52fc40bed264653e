"""One palette for the sidebar, the widget and the matplotlib figure, in both themes.

The CSS defines each ``--nbckpt-<role>`` colour once, as a JupyterLab theme variable
with JupyterLab Light's value as fallback; ``nbckpt/widgets/palette.py`` holds the same
values for matplotlib, and both must be what JupyterLab's own theme files say.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import matplotlib.colors as mcolors
import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.text import Text

from nbckpt.journal import JournalWriter
from nbckpt.widgets import plot_timeline
from nbckpt.widgets.palette import DARK, JUPYTERLAB_VARIABLES, LIGHT, ROLES, lab_theme
from tests.journal_scripts import SAVE, T0, failing_save, write_script

REPO = Path(__file__).resolve().parents[1]
STYLE = REPO / "labextension" / "style"
BUILT_CSS = REPO / "nbckpt" / "widgets" / "static" / "progress.css"
HARD_CODED = re.compile(r"#[0-9a-fA-F]{3,8}\b|(?<![\w-])(white|black)(?![\w-])|rgba?\(")
DEFINITION = re.compile(r"--nbckpt-([a-z_]+):\s*var\((--jp-[a-z0-9-]+),\s*(#[0-9a-f]{6})\s*\);")


def _definitions(css: str) -> dict[str, tuple[str, str]]:
    return {role: (var, hex_) for role, var, hex_ in DEFINITION.findall(css)}


@pytest.mark.parametrize("css", [STYLE / "palette.css", BUILT_CSS], ids=["source", "widget"])
def test_css_palette_is_the_python_palette(css: Path) -> None:
    # The widget's built CSS carries the same definitions as the lab's (one source).
    found = _definitions(css.read_text())
    assert set(found) == set(ROLES)
    for role in ROLES:
        var, fallback = found[role]
        assert var == JUPYTERLAB_VARIABLES[role], role
        assert fallback == LIGHT.roles()[role], role


def _theme_values(theme: str) -> dict[str, str]:
    """``--jp-*`` variable -> colour, from JupyterLab's installed theme CSS."""
    from jupyterlab.commands import get_app_dir

    css = Path(get_app_dir(), "themes", "@jupyterlab", f"theme-{theme}-extension", "index.css")
    values = {}
    for name, value in re.findall(r"(--jp-[a-z0-9-]+):([^;}]+)", css.read_text()):
        fallback = re.fullmatch(r"var\(--md-[a-z0-9-]+,\s*(#[0-9a-f]{3,6})\)", value.strip())
        values[name] = fallback.group(1) if fallback else value.strip()
    return values


@pytest.mark.parametrize(("theme", "pal"), [("light", LIGHT), ("dark", DARK)])
def test_python_palette_is_what_jupyterlab_themes_show(theme, pal) -> None:
    values = _theme_values(theme)
    for role, var in JUPYTERLAB_VARIABLES.items():
        assert mcolors.to_hex(values[var]) == pal.roles()[role], (theme, role, var)


def test_no_colour_is_hard_coded_outside_the_theme_variables() -> None:
    # Hard-coded colours are what made white-on-white chips in dark themes.
    for css in ("base.css", "timeline.css", "widget.css"):
        text = re.sub(r"/\*.*?\*/", "", (STYLE / css).read_text(), flags=re.S)
        text = re.sub(r"var\(--[a-z0-9-]+,[^()]*(\([^()]*\))?[^()]*\)", "", text)
        assert not HARD_CODED.search(text), css
    for ts in ("timeline.ts", "widget/progress.ts"):
        source = (REPO / "labextension" / "src" / ts).read_text()
        assert not re.search(r"['\"]#[0-9a-fA-F]{3,8}['\"]", source), ts


def test_every_phase_has_its_own_colour() -> None:
    for pal in (LIGHT, DARK):
        colours = [pal.roles()[r] for r in ROLES if r != "commit"]
        assert len(set(colours)) == len(colours)
        assert pal.color("read") != pal.color("write")
        assert pal.color("barrier:tmp_ready") == pal.barrier


def _restore(root: Path) -> None:
    for p in (0, 1):
        w = JournalWriter(root, "restore-op", p, "restore", 7)
        w.emit("requested", t=T0, process_count=2)
        w.emit("read_started", t=T0 + 0.01)
        w.emit("read_done", t=T0 + 0.2 + p / 100, bytes=1000)
        w.emit("restored", t=T0 + 0.2 + p / 100)
        w.close()


def _faces(fig: Figure) -> dict[str, str]:
    (ax,) = fig.axes
    return {
        str(c.get_gid()): mcolors.to_hex(c.get_facecolor()[0], keep_alpha=False)
        for c in ax.collections
        if c.get_gid()
    }


@pytest.mark.parametrize(("theme", "pal"), [("light", LIGHT), ("dark", DARK)])
def test_figure_uses_the_palette_of_its_theme(tmp_path, theme, pal) -> None:
    write_script(tmp_path, "op", SAVE)
    _restore(tmp_path)
    faces = _faces(plot_timeline(tmp_path, "op", theme=theme))
    assert faces["0:snapshot"] == pal.snapshot
    assert faces["0:write"] == pal.write
    assert faces["0:finalize"] == pal.finalize
    assert faces["0:barrier:tmp_ready"] == pal.barrier
    # A restore's reads are drawn in the read colour, not the write colour.
    faces = _faces(plot_timeline(tmp_path, "restore-op", theme=theme))
    assert faces["0:read"] == pal.read != pal.write


def test_dark_figure_is_transparent_with_light_text(tmp_path) -> None:
    write_script(tmp_path, "op", SAVE)
    fig = plot_timeline(tmp_path, "op", theme="dark")
    (ax,) = fig.axes
    assert fig.patch.get_alpha() == 0.0 and ax.patch.get_alpha() == 0.0
    for text in [ax.xaxis.label, *ax.get_yticklabels(), *ax.get_legend().get_texts()]:
        assert mcolors.to_hex(text.get_color()) == DARK.text
    png = tmp_path / "dark.png"
    plot_timeline(tmp_path, "op", theme="dark", save=png)
    from PIL import Image

    assert Image.open(png).convert("RGBA").getpixel((0, 0))[3] == 0  # see-through corner


def test_light_figure_is_white(tmp_path) -> None:
    write_script(tmp_path, "op", SAVE)
    fig = plot_timeline(tmp_path, "op", theme="light")
    assert mcolors.to_hex(fig.patch.get_facecolor()) == "#ffffff"
    with pytest.raises(ValueError, match="'auto', 'light' or 'dark'"):
        plot_timeline(tmp_path, "op", theme="sepia")  # type: ignore[arg-type]


def _settings(folder: Path, text: str) -> None:
    path = folder / "@jupyterlab" / "apputils-extension" / "themes.jupyterlab-settings"
    path.parent.mkdir(parents=True)
    path.write_text(text)


def test_auto_theme_follows_the_labs_saved_theme(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("JUPYTERLAB_SETTINGS_DIR", str(tmp_path / "settings"))
    assert lab_theme() is None  # nothing saved: the figure is light
    write_script(tmp_path, "op", SAVE)
    assert plot_timeline(tmp_path, "op").patch.get_alpha() == 1.0
    # JupyterLab writes its settings as JSON with // comments.
    _settings(tmp_path / "settings", '{\n  // Theme\n  "theme": "JupyterLab Dark"\n}\n')
    assert lab_theme() == "dark"
    assert plot_timeline(tmp_path, "op").patch.get_alpha() == 0.0


def test_auto_theme_does_not_guess_a_system_theme(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("JUPYTERLAB_SETTINGS_DIR", str(tmp_path))
    _settings(tmp_path, json.dumps({"theme": "JupyterLab Dark", "adaptive-theme": True}))
    assert lab_theme() is None
    (tmp_path / "@jupyterlab/apputils-extension/themes.jupyterlab-settings").write_text("{,")
    assert lab_theme() is None


def _boxes(fig: Figure) -> dict[str, object]:
    FigureCanvasAgg(fig).draw()
    renderer = fig.canvas.get_renderer()  # type: ignore[attr-defined]
    (ax,) = fig.axes
    return {
        str(t.get_gid()): t.get_window_extent(renderer)
        for t in ax.texts
        if isinstance(t, Text) and str(t.get_gid()).startswith("label:")
    }


def _long_failure() -> list[tuple[int, float, str, dict[str, object]]]:
    # As in the review: a snapshot of tens of ms, a failure seconds later.
    kept = [e for e in SAVE if e[1] <= 0.30]
    return [
        *kept,
        (1, 3.10, "failed", {"error": "process 0 died (no heartbeat for 3.0 s)", "phase": "write"}),
        (0, 3.12, "failed", {"error": "PeerFailedError: process 1 failed", "phase": "write"}),
    ]


@pytest.mark.parametrize("script", [failing_save(), _long_failure()], ids=["short", "long"])
def test_failed_save_labels_do_not_overlap(tmp_path, script) -> None:
    write_script(tmp_path, "op", script)
    boxes = _boxes(plot_timeline(tmp_path, "op", theme="light"))
    blocking, background = boxes["label:blocking"], boxes["label:background"]
    assert blocking.x1 <= background.x0  # type: ignore[attr-defined]


def test_release_labels_do_not_overlap(tmp_path) -> None:
    write_script(tmp_path, "op", SAVE)  # write_complete and commit_complete 60 ms apart
    boxes = [b for gid, b in _boxes(plot_timeline(tmp_path, "op")).items() if "release" in gid]
    assert len(boxes) == 3
    for i, a in enumerate(boxes):
        for b in boxes[i + 1 :]:
            assert not a.overlaps(b)  # type: ignore[attr-defined]
