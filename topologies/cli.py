"""Command line: `python -m topologies describe SPEC --nodes N` prints n, edges, rho, gap, beta."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Sequence

from .errors import TopologyError
from .factory import build
from .mixing import RULES
from .spec import spec_help


def _parser() -> argparse.ArgumentParser:
    """The argparse parser of `python -m topologies`."""
    parser = argparse.ArgumentParser(
        prog="python -m topologies",
        description="Inspect the graphs and mixing matrices used for decentralized learning.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="topology specs:\n" + spec_help(),
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    describe = sub.add_parser(
        "describe",
        help="print n, edges, degree min/mean/max, rho, gap, beta of a topology",
        description="Build a topology from SPEC and print n, edges, degree min/mean/max, "
        "rho = ||W - J||_2, spectral gap 1 - rho and beta = ||I - W||_2.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="topology specs:\n" + spec_help(),
    )
    describe.add_argument("spec", metavar="SPEC",
                          help="topology spec, e.g. ring, torus:rows=4, erdos-renyi:p=0.3, a graph "
                          "file, or module:function: f(n) or, time-varying, f(n, t) (see below)")
    describe.add_argument("-n", "--nodes", type=int, default=None, metavar="N",
                          help="number of nodes (required unless SPEC is a graph file)")
    describe.add_argument("--weights", default="metropolis", metavar="RULE",
                          help=f"weight rule: {', '.join(RULES)} (default: metropolis)")
    describe.add_argument("--lazy", action="store_true", help="use the lazy matrix (I + W) / 2")
    describe.add_argument("--seed", type=int, default=0, metavar="S",
                          help="seed of random graphs and matchings (default: 0)")
    describe.add_argument("--plot", metavar="FILE.png", default=None,
                          help="also draw the graph (weights as edge widths, gap in the title) "
                          "to this PNG file")
    describe.add_argument("--json", action="store_true", help="print the summary as JSON")
    sub.add_parser("list", help="list the valid topology specs",
                   description="List the valid topology specs.")
    return parser


def _format(info: dict) -> str:
    """Aligned 'key value' lines for the describe summary."""
    lines = [f"topology     {info['name']}", f"nodes        {info['n']}"]
    if info.get("time_varying"):
        lines += [
            f"period       {info['period'] if info['period'] else 'none (new graph every round)'}",
            f"edges        {info['edges_round_1']} in round 1",
        ]
    else:
        lines.append(f"edges        {info['edges']}{' (directed)' if info['directed'] else ''}")
    lines += [
        f"degree       min {info['degree_min']}, mean {info['degree_mean']:.3f}, "
        f"max {info['degree_max']}",
        f"weights      {info['weights']}{' (lazy)' if info['lazy'] else ''}",
    ]
    if info.get("time_varying"):
        if info["product_rho"] is not None:
            lines.append(f"rho of product over {info['product_rounds']} rounds  "
                         f"{info['product_rho']:.6g}")
    else:
        lines += [f"rho          {info['rho']:.6g}", f"gap          {info['gap']:.6g}",
                  f"beta         {info['beta']:.6g}", f"spectrum     {info['spectrum']}"]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status (2 on a topology error)."""
    args = _parser().parse_args(argv)
    if args.command == "list":
        print(spec_help())
        return 0
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        topology = build(args.spec, args.nodes, weights=args.weights, lazy=args.lazy,
                         seed=args.seed)
        info = topology.describe()
        if args.plot:
            from .plot import draw

            info["plot"] = str(draw(topology, args.plot))
    except TopologyError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(info, indent=2) if args.json else _format(info))
    if args.plot and not args.json:
        print(f"plot         {info['plot']}")
    return 0
