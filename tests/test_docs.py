"""The site's generated pages hold what the code holds (``make docs`` builds the site)."""

from __future__ import annotations

import sys
from pathlib import Path

import nbckpt.errors as errors

DOCS = Path(__file__).resolve().parent.parent / "docs"
sys.path.insert(0, str(DOCS))

from _generate import magics_page, troubleshooting_page  # noqa: E402


def test_every_error_class_is_on_the_troubleshooting_page_with_what_to_do():
    page = troubleshooting_page()
    classes = [n for n in errors.__all__ if isinstance(getattr(errors, n), type)]
    missing = [n for n in classes if f"`{n}`" not in page and f"## {n}\n" not in page]
    assert missing == []
    for group in errors.GROUPS:
        assert group.what_to_do and f"**What to do:** {group.what_to_do}." in page


def test_every_magic_is_on_the_magics_page_with_its_help():
    from nbckpt.magics.commands import NbckptMagics

    page = magics_page()
    for name in NbckptMagics.magics["line"]:
        assert f"## `%{name}`" in page
    assert "--mode {rename,commit_file}" in page and "--persistent-every M" in page
