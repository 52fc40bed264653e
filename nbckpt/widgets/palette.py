"""One palette for every picture of an operation: lab sidebar, live widget, matplotlib.

The browser views colour each phase with a CSS custom property (``--nbckpt-write``,
...) defined once in ``labextension/style/palette.css`` as a JupyterLab theme variable,
so they follow the lab's theme by themselves. The kernel cannot see that theme, so
:func:`~nbckpt.widgets.timeline.plot_timeline` takes the same colours from here: each
role's JupyterLab variable as the light and the dark theme of JupyterLab define it.
``tests/test_palette.py`` checks that the CSS fallbacks are :data:`LIGHT` and that both
palettes are what JupyterLab's own theme files say, so the pictures cannot drift apart.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from nbckpt.protocol import BARRIER_PREFIX, Phase, Status

__all__ = [
    "DARK",
    "JUPYTERLAB_VARIABLES",
    "LIGHT",
    "ROLES",
    "Palette",
    "ThemeName",
    "lab_theme",
    "palette",
    "role_of",
]

ThemeName = Literal["light", "dark"]

_BARRIER = BARRIER_PREFIX.removesuffix(":")

#: The colour roles, each a CSS custom property ``--nbckpt-<role>``: a phase of the
#: protocol, barrier waits, a failure's outline and the commit marker.
ROLES: tuple[str, ...] = (
    Phase.SNAPSHOT,
    Phase.WRITE,
    Phase.READ,
    Phase.FINALIZE,
    _BARRIER,
    Status.FAILED,
    "commit",
)

#: The JupyterLab theme variable behind each role. The snapshot is the part of a save
#: the notebook waits for, hence the warning colour; a restore's reads get their own
#: (info) colour so they are never mistaken for a save's writes.
JUPYTERLAB_VARIABLES: dict[str, str] = {
    Phase.SNAPSHOT: "--jp-warn-color1",
    Phase.WRITE: "--jp-brand-color1",
    Phase.READ: "--jp-info-color1",
    Phase.FINALIZE: "--jp-success-color1",
    _BARRIER: "--jp-layout-color4",
    Status.FAILED: "--jp-error-color1",
    "commit": "--jp-success-color0",
}


@dataclass(frozen=True)
class Palette:
    """The colours of one theme, as ``#rrggbb`` strings.

    Attributes
    ----------
    snapshot, write, read, finalize, barrier, failed, commit
        The colour of each role of :data:`ROLES`.
    text, muted
        Text and secondary text (axes, release lines).
    background
        The figure's face colour; None draws it transparent, over whatever the
        notebook's cell is painted with.
    """

    snapshot: str
    write: str
    read: str
    finalize: str
    barrier: str
    failed: str
    commit: str
    text: str
    muted: str
    background: str | None

    def roles(self) -> dict[str, str]:
        """Each role of :data:`ROLES` and its colour."""
        return {role: getattr(self, role) for role in ROLES}

    def color(self, phase: str) -> str:
        """The colour of a phase name (a barrier wait ``barrier:<name>`` included)."""
        return self.roles().get(role_of(phase), self.muted)


#: JupyterLab Light's values of :data:`JUPYTERLAB_VARIABLES`; also the CSS fallbacks.
LIGHT = Palette(
    snapshot="#f57c00",
    write="#1976d2",
    read="#0097a7",
    finalize="#388e3c",
    barrier="#757575",
    failed="#d32f2f",
    commit="#1b5e20",
    text="#212121",
    muted="#616161",
    background="#ffffff",
)

#: JupyterLab Dark's values, drawn on a transparent background with light text.
DARK = Palette(
    snapshot="#ff9800",
    write="#2196f3",
    read="#00bcd4",
    finalize="#4caf50",
    barrier="#757575",
    failed="#f44336",
    commit="#388e3c",
    text="#e0e0e0",
    muted="#bdbdbd",
    background=None,
)


def role_of(phase: str) -> str:
    """The colour role of a phase: its name, or ``barrier`` for any barrier wait."""
    return _BARRIER if phase.startswith(BARRIER_PREFIX) else phase


def palette(theme: ThemeName) -> Palette:
    """The palette of ``theme``."""
    return DARK if theme == "dark" else LIGHT


_THEMES_SETTINGS = Path("@jupyterlab") / "apputils-extension" / "themes.jupyterlab-settings"


def _settings_dir() -> Path | None:
    # Where JupyterLab (jupyterlab_server) keeps user settings; the kernel usually
    # inherits the server's environment, so it finds the same folder.
    explicit = os.environ.get("JUPYTERLAB_SETTINGS_DIR")
    if explicit:
        return Path(explicit)
    try:
        from jupyter_core.paths import jupyter_config_dir
    except ImportError:
        return None
    return Path(jupyter_config_dir()) / "lab" / "user-settings"


def lab_theme() -> ThemeName | None:
    """The JupyterLab theme the user last chose, if the kernel can read it.

    Returns
    -------
    "light", "dark" or None
        None when the settings file is not on this machine (a remote kernel), cannot be
        parsed, or the theme follows the system's (``adaptive-theme``).

    Notes
    -----
    JupyterLab saves the theme to its user settings as soon as it changes, so a kernel
    on the same machine sees it; one that runs elsewhere does not.
    """
    folder = _settings_dir()
    if folder is None:
        return None
    try:
        raw = (folder / _THEMES_SETTINGS).read_text(encoding="utf-8")
        # The file is JSON with // comments (JupyterLab writes JSON5).
        settings = json.loads(re.sub(r"(?m)^\s*//.*$", "", raw))
    except (OSError, ValueError):
        return None
    if not isinstance(settings, dict) or settings.get("adaptive-theme"):
        return None
    name = settings.get("theme")
    if not isinstance(name, str):
        return None
    return "dark" if "dark" in name.lower() else "light"
