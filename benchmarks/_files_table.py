"""The report's table of a restore against a plain read of the step's own files.

It splits the distance between nbckpt's cold restore and the plain-file limit in two:
the restore against a plain read of the files it reads (the restore's own work), and
that read against the limit's one file per process (the cost of the step's files).
"""

from __future__ import annotations

from collections.abc import Iterable

from _compare_report import SizeResult, fmt_size, med, secs, spread

from nbckpt.engine.restore.chunkfiles import SUM_PIECE


def files_table(results: Iterable[SizeResult], processes: int, reps: int) -> list[str]:
    """Markdown lines for every state and size measured, smallest first; ends blank."""
    rows = sorted(
        (r for r in results if r.files_read), key=lambda r: (r.nbytes, r.layout != "fsdp")
    )
    if not rows:
        return []
    lines = [
        f"### Cold restore against a plain read of its own files ({processes} processes, "
        f"medians of {reps})",
        "",
        "| state | size | files per process | cold restore: nbckpt | plain read of its files "
        "| plain-file limit | nbckpt / its files | its files / limit |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        lines.append(
            f"| {r.layout} | {fmt_size(r.nbytes)} | {r.files_per_process} "
            f"| {secs(med(r.nb_restore))} | {secs(med(r.files_read))} | {secs(med(r.lim_read))} "
            f"| {spread(r.files_read, r.nb_restore)} | {spread(r.lim_read, r.files_read)} |"
        )
    lines += [
        "",
        "After each restore the page cache is dropped again and the step's files (its "
        "chunk files and packs, not its records) are read plainly, each once, the way a "
        "restore reads a chunk file but without its checks and mapping (by as many "
        "threads per process as a restore reads chunk files with, each file whole, "
        f"{fmt_size(SUM_PIECE)} at a time into a reused buffer), the files split among the "
        "processes to even out their bytes (largest first), timed between two barriers. "
        "nbckpt / its files is nbckpt's speed over that read's (1x: the restore's planning, "
        "checks and placing cost nothing), its files / limit that read's speed over the "
        "plain-file limit's (below 1x: reading the step's many files costs more than one "
        "file per process). Each is the median over repetitions of the ratio within one, "
        "with the smallest and largest in parentheses.",
        "",
    ]
    return lines
