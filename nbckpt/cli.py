"""The ``nbckpt`` command."""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    """Dispatch ``nbckpt <command> ...``; only ``demo`` exists so far."""
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] in ("-h", "--help"):
        print("usage: nbckpt demo [options]   (nbckpt demo --help for the options)")
        return 0 if args else 2
    if args[0] == "demo":
        from nbckpt.demo import main as demo_main

        return demo_main(args[1:])
    print(f"nbckpt: unknown command {args[0]!r}; try 'nbckpt demo'", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
