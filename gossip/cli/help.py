"""What a script prints before it runs: the ``--help`` layout and ``--list [KIND]``.

Built from :mod:`gossip.catalog` and the topology tables, so neither imports torch."""

from __future__ import annotations

import argparse
import sys
import textwrap
from collections.abc import Callable
from typing import Any


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Appends ``(default: X)`` to a flag's help once: not when the help already states its
    default, nor for flags whose default is None or False (nothing useful to show). Lines
    wrap at spaces only, so names such as ``zero-one-adam`` or ``sign_l2`` stay whole."""

    def _split_lines(self, text: str, width: int) -> list[str]:
        text = self._whitespace_matcher.sub(" ", text).strip()
        return textwrap.wrap(text, width, break_on_hyphens=False)

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        text = self._whitespace_matcher.sub(" ", text).strip()
        return textwrap.fill(text, width, initial_indent=indent, subsequent_indent=indent,
                             break_on_hyphens=False)

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        # identity, not ==: a default of 0 or 0.0 is worth showing, and 0.0 == False
        if "default" in text.lower() or any(action.default is v for v in (None, False, argparse.SUPPRESS)):
            return text
        return super()._get_help_string(action)


def topology_forms() -> str:
    """The topology specs ``topologies.build`` accepts, from its own tables (never stale)."""
    from topologies.spec import STATIC, TIME_VARYING

    return ", ".join(e.usage() for e in (*STATIC.values(), *TIME_VARYING.values()))


LIST_KINDS = ("algorithms", "compressors", "topologies", "weights", "problems")
"""What ``--list KIND`` prints (``--list`` alone: all of them)."""


def listing(kind: str = "all", algorithms: Callable[[], list[str]] | None = None) -> str:
    """The registered names of ``kind`` (one of :data:`LIST_KINDS`, or ``"all"``), as ``--list``
    prints them; ``algorithms`` gives the names a script runs (default: every registered one).
    Built from :mod:`gossip.catalog` and the topology tables: nothing imports torch."""
    from gossip import catalog
    from topologies.spec import spec_help

    def section(name: str) -> str:
        if name == "algorithms":
            names = algorithms() if algorithms is not None else catalog.algorithms()
            return f"algorithms (--algorithm): {', '.join(names)}; or module:Class"
        if name == "compressors":
            usage = catalog.compressor_usage().split("; ")
            return "compressors (--compressor):\n" + "\n".join(f"  {u}" for u in usage)
        if name == "topologies":
            return f"topologies (--topology):\n{spec_help()}"
        if name == "weights":
            from topologies.mixing import RULES

            return f"weights (--weights): {', '.join(RULES)}"
        return f"problems (--problem, optimize.py): {', '.join(catalog.problems())}; or module:function"

    return "\n".join(section(k) for k in (LIST_KINDS if kind == "all" else (kind,)))


class ListAction(argparse.Action):
    """``--list [KIND]``: print :func:`listing` and exit 0, as ``--help`` does (before the
    other flags are checked, so it needs none of them). Not a run setting: a ``--config``
    file cannot set it."""

    not_a_setting = True

    def __init__(self, option_strings: list[str], dest: str,
                 algorithms: Callable[[], list[str]] | None = None, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs="?", const="all", default=argparse.SUPPRESS,
                         choices=("all", *LIST_KINDS), metavar="KIND", **kwargs)
        self.algorithms = algorithms

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> None:
        parser._print_message(listing(values, self.algorithms) + "\n", sys.stdout)  # rank 0 only
        parser.exit(0)


def add_list_argument(parser: argparse.ArgumentParser,
                      algorithms: Callable[[], list[str]] | None = None) -> None:
    """``--list [KIND]`` on ``parser``; ``algorithms``: the algorithm names this script runs."""
    parser.add_argument("--list", action=ListAction, algorithms=algorithms,
                        help=f"print the registered names of KIND ({', '.join(LIST_KINDS)}; "
                             "default: all of them) and exit")
