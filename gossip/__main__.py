"""``python -m gossip list [KIND]``: the registered algorithms, compressors, topologies, weight
rules and problems, as every script's ``--list`` prints them (nothing imports torch)."""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    """Parse ``argv`` (default: the command line) and print the listing; returns the exit status."""
    from gossip.cli import LIST_KINDS, listing

    parser = argparse.ArgumentParser(prog="python -m gossip", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True, metavar="list")
    show = commands.add_parser("list", help="print the registered names of KIND (default: all)")
    show.add_argument("kind", nargs="?", default="all", choices=("all", *LIST_KINDS),
                      metavar="KIND", help=f"one of {', '.join(LIST_KINDS)} (default: all of them)")
    args = parser.parse_args(argv)
    print(listing(args.kind))
    return 0


if __name__ == "__main__":
    sys.exit(main())
