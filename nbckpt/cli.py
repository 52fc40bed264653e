"""The ``nbckpt`` command: ``nbckpt demo`` and ``nbckpt fsck ROOT [--clean] [--verify]``."""

from __future__ import annotations

import argparse
import sys

__all__ = ["fsck_main", "main"]

_USAGE = (
    "usage: nbckpt demo [options]            run the demo (nbckpt demo --help)\n"
    "       nbckpt fsck ROOT [--clean] [--verify]   check a checkpoint directory"
)


def fsck_main(argv: list[str]) -> int:
    """Run ``nbckpt fsck``: print :func:`nbckpt.formats.fsck.fsck`'s report.

    Returns
    -------
    int
        0 when the root holds no problem, 1 when it holds a corrupt step or an
        abandoned entry that is still there (``--clean`` removes those), 2 for a usage
        error or a root that cannot be read.
    """
    parser = argparse.ArgumentParser(
        prog="nbckpt fsck",
        description="Check a checkpoint directory: complete, in progress, abandoned, "
        "corrupt and foreign entries. Exit status 0: no problem; 1: problems found; "
        "2: usage error or unreadable root.",
    )
    parser.add_argument(
        "root", metavar="ROOT", help="checkpoint directory, or s3:// or gs://bucket/prefix"
    )
    parser.add_argument(
        "--clean",
        action="store_true",
        help="remove abandoned entries (never a complete step)",
    )
    parser.add_argument(
        "--verify",
        action="store_true",
        help="recompute every chunk's checksum recorded at save time",
    )
    parser.add_argument(
        "--stale-after",
        type=float,
        default=None,
        metavar="S",
        help="take an unfinished save silent for S seconds as abandoned (default 600; "
        "0 when you know its job is dead)",
    )
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # argparse's own exit: 0 for --help, 2 for a usage error
        return int(e.code or 0)
    from nbckpt.errors import StorageError
    from nbckpt.formats.fsck import fsck

    try:
        stale = {} if args.stale_after is None else {"stale_after_s": args.stale_after}
        report = fsck(args.root, clean=args.clean, verify=args.verify, **stale)
    except (FileNotFoundError, StorageError, ValueError) as e:  # one line, no traceback
        print(f"nbckpt fsck: {e}", file=sys.stderr)
        return 2
    print(report.table())
    left = [e for e in report.by_state("abandoned") if e.path not in report.removed]
    return 1 if report.by_state("corrupt") or left else 0


def main(argv: list[str] | None = None) -> int:
    """Dispatch ``nbckpt <command> ...``: ``demo`` or ``fsck``; return the exit status."""
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] in ("-h", "--help"):
        print(_USAGE)
        return 0 if args else 2
    if args[0] == "demo":
        from nbckpt.demo import main as demo_main

        return demo_main(args[1:])
    if args[0] == "fsck":
        return fsck_main(args[1:])
    print(
        f"nbckpt: unknown command {args[0]!r}; try 'nbckpt fsck ROOT' or 'nbckpt demo'",
        file=sys.stderr,
    )
    return 2


if __name__ == "__main__":
    sys.exit(main())
