"""What the site draws from the code and from real runs, written before Sphinx reads.

``conf.py`` calls :func:`generate`, which writes ``docs/_generated/`` (never committed):

- ``magics.md``: every ``%ckpt_*`` magic's help, the text ``%magic?`` shows, from the
  same argument declarations (``nbckpt.magics.args``).
- ``troubleshooting.md``: every error class of ``nbckpt.errors``, by group: what it
  means (its docstring) and what to do (its group's). A class missing from the page
  cannot happen: the page is the classes.
- ``results.md``: ``benchmarks/RESULTS.md``, its figures copied where the site finds them.
- ``figures/``: timelines nbckpt itself draws (``nbckpt.widgets.timeline``) of a real
  run: ``python -m nbckpt.demo`` with 4 JAX processes on 127.0.0.1, small.
- ``notebooks/``: the teaching notebooks. A copy the test run executed
  (``tests/test_notebooks.py`` writes ``build/executed-notebooks/``) is used when it
  was made from the notebook as it is now; otherwise the notebook without outputs,
  which myst-nb executes during the build. Outputs are never committed by hand.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent
REPO = DOCS.parent
OUT = DOCS / "_generated"
EXECUTED = REPO / "build" / "executed-notebooks"
NOTEBOOKS = REPO / "notebooks"


def source_digest(path: Path) -> str:
    """The digest an executed copy records of the notebook it was made from."""
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _write(path: Path, text: str) -> None:
    """Write only on change, so Sphinx rereads only what changed."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.exists() or path.read_text() != text:
        path.write_text(text)


def magics_page() -> str:
    """Every magic's help, as ``%magic?`` shows it."""
    from nbckpt.magics.commands import NbckptMagics

    names = sorted(NbckptMagics.magics["line"])
    lines = [
        "# The magics",
        "",
        "`%load_ext nbckpt` registers them. Each is a thin shell over the Python API",
        "(`nbckpt.session.client.CheckpointClient`, `nbckpt.session.cluster.JaxCluster`).",
        "This page is generated from the magics' own argument declarations: it is the",
        "text `%ckpt_save?` shows, for every magic.",
        "",
    ]
    for name in names:
        doc = inspect.cleandoc(getattr(NbckptMagics, NbckptMagics.magics["line"][name]).__doc__)
        doc = doc.removeprefix("::").strip("\n")
        lines += [f"## `%{name}`", "", "```text", doc, "```", ""]
    return "\n".join(lines)


def troubleshooting_page() -> str:
    """Every error a user can meet, by what the user does about it."""
    import nbckpt.errors as errors

    def first_paragraph(cls: type) -> str:
        doc = inspect.cleandoc(cls.__doc__ or "")
        return doc.split("\n\n")[0].replace("\n", " ")

    def rest(cls: type) -> str:
        doc = inspect.cleandoc(cls.__doc__ or "")
        parts = doc.split("\n\n")[1:]
        kept = [p for p in parts if not p.startswith(("Attributes", "Parameters"))]
        return "\n\n".join(kept)

    lines = [
        "# Troubleshooting: every error, what it means, what to do",
        "",
        "Every error nbckpt raises on purpose is an `NbckptError` (`nbckpt.NbckptError`), in",
        "one of five",
        "groups by what you do about it. Each message is one line: what happened and what",
        "to do next. This page is generated from the error classes themselves",
        "(`nbckpt.errors`), so none is missing.",
        "",
    ]
    for group in errors.GROUPS:
        lines += [f"## {group.__name__}", "", first_paragraph(group), ""]
        if rest(group):
            lines += [rest(group), ""]
        lines += [f"**What to do:** {group.what_to_do}.", ""]
        members = [
            getattr(errors, n)
            for n in errors.__all__
            if isinstance(getattr(errors, n), type)
            and issubclass(getattr(errors, n), group)
            and getattr(errors, n) is not group
        ]
        for cls in members:
            bases = [b.__name__ for b in cls.__mro__[1:] if b.__module__ == "builtins"]
            also = f" (also a `{bases[0]}`)" if bases and bases[0] != "Exception" else ""
            lines += [f"### `{cls.__name__}`{also}", "", first_paragraph(cls), ""]
            if rest(cls):
                lines += [rest(cls), ""]
            lines += [f"*What to do:* {group.what_to_do}.", ""]
    return "\n".join(lines)


def figures() -> None:
    """Timelines of a real save and restore: the demo, 4 processes, 16 MiB."""
    out = OUT / "figures"
    wanted = [out / "save_timeline.png", out / "restore_timeline.png"]
    if all(p.exists() for p in wanted):
        return
    run = OUT / "run"
    shutil.rmtree(run, ignore_errors=True)
    demo = ["--processes", "4", "--mib", "16", "--steps", "4", "--save-every", "2"]
    done = subprocess.run(
        [sys.executable, "-m", "nbckpt.demo", *demo, "--root", str(run)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    if done.returncode != 0:  # the build stops with the demo's own words, not a bare code
        raise RuntimeError(f"the demo run for the figures failed:\n{done.stderr[-2000:]}")
    import matplotlib

    matplotlib.use("Agg")
    from nbckpt.journal import list_operations, read_operation
    from nbckpt.widgets.timeline import plot_timeline

    ops = [read_operation(run, op) for op in list_operations(run)]
    save = [r for r in ops if r.kind == "save"][-1]
    restore = [r for r in ops if r.kind == "restore"][-1]
    out.mkdir(parents=True, exist_ok=True)
    plot_timeline(run, save.op, save=str(wanted[0]), theme="light")
    plot_timeline(run, restore.op, save=str(wanted[1]), theme="light")


def notebooks() -> list[str]:
    """Copy the teaching notebooks in; return those myst-nb will have to execute."""
    out = OUT / "notebooks"
    out.mkdir(parents=True, exist_ok=True)
    unexecuted = []
    for path in sorted(NOTEBOOKS.glob("*.ipynb")):
        executed = EXECUTED / path.name
        fresh = False
        if executed.exists():
            meta = json.loads(executed.read_text()).get("metadata", {})
            fresh = meta.get("nbckpt", {}).get("source_sha256") == source_digest(path)
        if not fresh:
            unexecuted.append(path.stem)
        nb = json.loads((executed if fresh else path).read_text())
        # myst-nb's "auto" would execute a test run's copy again, since some cells print
        # nothing: each copy says whether it is to be executed.
        run = "off" if fresh or os.environ.get("NBCKPT_DOCS_EXECUTE") == "off" else "force"
        nb.setdefault("metadata", {})["mystnb"] = {"execution_mode": run}
        # Cells hold IPython (magics, $VAR): highlighted as such, not as plain Python.
        nb.setdefault("metadata", {})["language_info"] = {
            **nb["metadata"].get("language_info", {}),
            "name": "python",
            "pygments_lexer": "ipython3",
        }
        _write(out / path.name, json.dumps(nb, indent=1) + "\n")
    return unexecuted


def results_page() -> str:
    """``benchmarks/RESULTS.md`` with its figures where the site finds them."""
    bench = REPO / "benchmarks"
    text = (bench / "RESULTS.md").read_text()
    for png in sorted(bench.glob("*.png")):
        target = OUT / "benchmarks" / png.name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(png, target)
        # A path beginning with / is the site's source folder, wherever it is included.
        text = text.replace(f"]({png.name})", f"](/_generated/benchmarks/{png.name})")
    return text


def generate() -> list[str]:
    """Write every generated page; return the notebooks myst-nb must execute."""
    _write(OUT / "results.md", results_page())
    _write(OUT / "magics.md", magics_page())
    _write(OUT / "troubleshooting.md", troubleshooting_page())
    figures()
    return notebooks()
