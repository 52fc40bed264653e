"""Screenshots as tests: compare a page element's picture with a committed reference.

``compare(actual, name)`` checks a screenshot against ``tests/browser/references/<name>``
with a tolerance: it fails when more than ``max_fraction`` of the pixels differ by more
than ``threshold`` (0-255, on any channel), so antialiasing does not count but a
changed colour, a moved column or a clipped line does. On a failure the diff image is
written next to the screenshot in ``artifacts/``. With ``NBCKPT_UPDATE_SCREENSHOTS=1``
the screenshot becomes the new reference instead.

Also: JupyterLab's theme through its settings file, and colour contrast of computed
styles.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import numpy as np
from PIL import Image

REFERENCES = Path(__file__).resolve().parent / "references"
UPDATE_ENV = "NBCKPT_UPDATE_SCREENSHOTS"
DARK_THEME = "JupyterLab Dark"


def set_lab_theme(settings_dir: Path, theme: str) -> None:
    """Make ``theme`` the theme of a JupyterLab whose settings are in ``settings_dir``.

    Written before the server starts (``JUPYTERLAB_SETTINGS_DIR``), it is the theme the
    page opens with.
    """
    path = settings_dir / "@jupyterlab" / "apputils-extension" / "themes.jupyterlab-settings"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"theme": theme}))


def differing_fraction(a: Image.Image, b: Image.Image, threshold: int) -> tuple[float, Image.Image]:
    """The fraction of pixels that differ by more than ``threshold``, and a diff image.

    Images of slightly different sizes (a line of text one pixel taller) are compared
    on their common part.
    """
    width, height = min(a.width, b.width), min(a.height, b.height)
    x = np.asarray(a.convert("RGB").crop((0, 0, width, height)), dtype=np.int16)
    y = np.asarray(b.convert("RGB").crop((0, 0, width, height)), dtype=np.int16)
    differs = np.abs(x - y).max(axis=2) > threshold
    diff = np.asarray(a.convert("RGB").crop((0, 0, width, height))).copy()
    diff[differs] = (255, 0, 255)
    return float(differs.mean()), Image.fromarray(diff)


def compare(
    actual: Path,
    name: str,
    *,
    threshold: int = 48,
    max_fraction: float = 0.015,
    max_size_change: int = 6,
) -> None:
    """Compare the screenshot ``actual`` with the reference ``name``; raise if they differ.

    Parameters
    ----------
    actual
        The PNG just taken.
    name
        The reference's file name under ``tests/browser/references``.
    threshold
        How far (0-255, on any channel) a pixel may be off and still match.
    max_fraction
        How many pixels, as a fraction, may be off.
    max_size_change
        How many pixels the width or height may differ by.
    """
    reference = REFERENCES / name
    if os.environ.get(UPDATE_ENV) == "1":
        REFERENCES.mkdir(exist_ok=True)
        shutil.copyfile(actual, reference)
        return
    if not reference.is_file():
        raise AssertionError(
            f"no reference {reference}: look at {actual}, then run the test with "
            f"{UPDATE_ENV}=1 to make it the reference"
        )
    a, b = Image.open(actual), Image.open(reference)
    if abs(a.width - b.width) > max_size_change or abs(a.height - b.height) > max_size_change:
        raise AssertionError(
            f"{actual.name} is {a.width}x{a.height}, its reference {b.width}x{b.height}"
        )
    fraction, diff = differing_fraction(a, b, threshold)
    if fraction > max_fraction:
        out = actual.with_name(f"{actual.stem}.diff.png")
        diff.save(out)
        raise AssertionError(
            f"{actual.name}: {fraction:.2%} of the pixels differ from {reference.name} "
            f"(at most {max_fraction:.2%}); the differing pixels are magenta in {out}. "
            f"If the change is wanted, rerun with {UPDATE_ENV}=1."
        )


def parse_rgba(css: str) -> tuple[float, float, float, float]:
    """``rgb(r, g, b)`` or ``rgba(r, g, b, a)`` as a computed style gives it."""
    found = re.fullmatch(r"rgba?\(([^)]*)\)", css.strip())
    if found is None:
        raise ValueError(f"not an rgb colour: {css!r}")
    parts = [float(v) for v in re.split(r"[,\s/]+", found.group(1).strip()) if v]
    return (parts[0], parts[1], parts[2], parts[3] if len(parts) > 3 else 1.0)


def _luminance(rgb: tuple[float, float, float]) -> float:
    def channel(c: float) -> float:
        c /= 255
        return c / 12.92 if c <= 0.03928 else ((c + 0.055) / 1.055) ** 2.4

    r, g, b = (channel(c) for c in rgb)
    return 0.2126 * r + 0.7152 * g + 0.0722 * b


def contrast(text: str, background: str) -> float:
    """The WCAG contrast ratio of computed ``color`` over computed ``background-color``.

    A translucent text colour is blended over the background first, as it is painted.
    """
    *fg, alpha = parse_rgba(text)
    *bg, _ = parse_rgba(background)
    r, g, b = (f * alpha + k * (1 - alpha) for f, k in zip(fg, bg, strict=True))
    hi, lo = sorted((_luminance((r, g, b)), _luminance((bg[0], bg[1], bg[2]))), reverse=True)
    return (hi + 0.05) / (lo + 0.05)
