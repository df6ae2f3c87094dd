"""The flags the scripts share, each defined once: the run's topology, seed, devices,
transport, network, outputs and checkpoints (:func:`add_run_arguments`), its length
(:func:`add_rounds_argument`), the federated methods' flags, ``--overlap`` and ``--hparam``."""

from __future__ import annotations

import argparse
from typing import Any

from gossip.cli.help import topology_forms
from gossip.cli.values import (
    DTYPE_NAMES,
    network_spec,
    non_negative_float,
    non_negative_int,
    positive_float,
    positive_int,
    seconds,
    thread_count,
)


def add_run_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags shared by every script (topology, seed, devices, MPI, logs, plots)."""
    g = parser.add_argument_group("run")
    g.add_argument("--nodes", type=positive_int, default=None,
                   help="number of nodes. In process: required unless the topology is a file "
                        "(default 8). Under mpiexec or torchrun: defaults to the world size; a "
                        "larger value hosts several nodes per rank")
    g.add_argument("--topology", default="ring",
                   help=f"graph spec: {topology_forms()}, a graph file (edge list, GraphML, GML, "
                        "JSON node-link) or module:function: f(n) a graph, f(n, t) the graph of round t "
                        "(default: ring)")
    g.add_argument("--weights", default="metropolis",
                   help="mixing rule: metropolis, max-degree, uniform, weights (explicit edge "
                        "'weight' attributes), push / pull (column- / row-stochastic, directed "
                        "graphs) (default: metropolis)")
    g.add_argument("--lazy", action="store_true", help="use the lazy matrix (I + W)/2")
    g.add_argument("--seed", type=non_negative_int, default=0, help="run seed; same seed, same numbers (default 0)")
    g.add_argument("--dtype", choices=DTYPE_NAMES, default="float32",
                   help="floating-point type of the models: what is stored, sent and mixed "
                        "(bfloat16/float16: half the bytes; docs/low-precision.md) (default "
                        "float32)")
    g.add_argument("--device", default="cpu", help="torch device: cpu or cuda (default cpu)")
    g.add_argument("--threads", type=thread_count, default=1,
                   help="torch threads per process (default 1: fastest under MPI and needed for "
                        "in-process runs to equal MPI runs bit for bit)")
    g.add_argument("--transport", default="auto",
                   choices=("auto", "local", "mpi", "torch", "gloo", "nccl"),
                   help="what carries messages between processes: auto (default: MPI under "
                        "mpiexec, torch.distributed under torchrun, else in process), local (one "
                        "process), mpi, torch (torchrun; NCCL for --device cuda, else gloo), "
                        "gloo (CPU tensors) or nccl (CUDA tensors); docs/transports.md")
    g.add_argument("--timeout", type=seconds, default=120.0,
                   help="seconds to wait for a neighbor, or for the other ranks at start-up, "
                        "before stopping with an error naming it (default 120)")
    g.add_argument("--network", type=network_spec, default="none", metavar="SPEC",
                   help="what messages meet on the way (docs/network.md): none (default), "
                        "loss=P (each message lost with probability P), loss=bernoulli:P, or "
                        "loss=ge:p_gb=P,p_bg=P[,loss_good=P][,loss_bad=P] (Gilbert-Elliott "
                        "bursts per arc). Lost messages move no bytes; the log gains "
                        "messages_lost. stale=K | geom:P | uniform:LO,HI | arcs:I>J@LAG+... "
                        "(messages of synchronous rounds handed over whole rounds late; the log "
                        "gains messages_late). Timing models (virtual time; the log gains "
                        "time_virtual_s): delay=DIST (seconds a message travels), compute=DIST "
                        "(seconds of one local step, default 1), DIST = S | fixed:S | exp:MEAN | "
                        "uniform:LO,HI | lognormal:MEDIAN,SIGMA; slow=FRACTIONxFACTOR or "
                        "slow=nodes:I+JxFACTOR (stragglers: compute times x FACTOR); "
                        "churn=rate:R,mean_away:S[,fresh] or churn=at:NODE@LEAVE-BACK+...[,fresh] "
                        "(asynchronous algorithms only). noise=V | var:V | std:S (a noisy "
                        "channel: every delivered message's decoded values + N(0, V) each; bits "
                        "unchanged). active=P | bernoulli:P | markov:p_off=P,p_on=P | "
                        "poisson:RATE | cyclic:K (synchronous partial activation: an inactive "
                        "node neither computes nor sends, its neighbors treat it as a lost "
                        "message; the log gains nodes_active). Join models with ';'")
    g.add_argument("--link-latency", type=non_negative_float, default=0.0, metavar="SECONDS",
                   help="simulate slow links: every round's messages arrive no earlier than "
                        "SECONDS after they are sent, in process and across processes "
                        "(default 0; e.g. 0.005 to measure what --overlap hides)")
    g.add_argument("--free-run", type=positive_float, default=None, metavar="SCALE",
                   help="under mpiexec with one node per rank, sleep the --network "
                        "compute/slow draws x SCALE wall seconds. Asynchronous algorithms run "
                        "free, in wall-clock order (loss= and delay= drawn per message); "
                        "--log-every K: the nodes' states at the "
                        "wall instants of every K sweeps, written after the run, then the end "
                        "record (docs/asynchronous.md). Synchronous ones keep their rounds, "
                        "each node sleeping its draw before sending; records gain wall_s "
                        "(docs/network.md). Default: virtual time only")
    g.add_argument("--log-every", type=positive_int, default=10, help="log every K rounds (default 10)")
    from gossip.memory import add_memory_argument

    add_memory_argument(g)
    g.add_argument("--out", default=None, help="JSON-lines log file (default: none)")
    g.add_argument("--plot", default=None, help="write a PNG plot here")
    g.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                   help="a progress bar on rank 0's stderr, shown once a run has taken 2 s "
                        "(default: on when stderr is a terminal, off when it is a file or a "
                        "pipe); --no-progress turns it off")
    g.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    c = parser.add_argument_group("long runs")
    c.add_argument("--checkpoint-every", type=non_negative_int, default=0, metavar="K",
                   help="write a checkpoint every K rounds (0: only on SIGINT/SIGTERM when "
                        "--checkpoint-dir is set)")
    c.add_argument("--checkpoint-dir", default=None, metavar="DIR",
                   help="where checkpoints go (one sub-directory per run)")
    c.add_argument("--resume", default=None, metavar="DIR",
                   help="continue from the checkpoints in DIR (same flags as the interrupted "
                        "run); finished runs are replayed from their records")


ROUNDS_HELP = ("the run's length in communication rounds: in a round every node updates its model "
               "and exchanges messages with its neighbors (an asynchronous algorithm's round is a "
               "sweep of n activations; docs/asynchronous.md)")
"""What ``--rounds`` means in every script."""


def add_rounds_argument(group: Any, default: int | None, *, aliases: tuple[str, ...] = (),
                        note: str = "") -> None:
    """``--rounds R``, the run's length, under one name and one meaning in every script;
    ``aliases`` are older spellings kept working (``--iterations``), ``note`` what this
    script adds (e.g. that it overrides ``--epochs``)."""
    group.add_argument("--rounds", *aliases, dest="rounds", type=positive_int, default=default,
                       metavar="R", help=ROUNDS_HELP + (f"; {note}" if note else ""))


FEDERATED_FLAGS = ("clients_per_round", "local_steps", "server_optimizer", "server_lr",
                   "sampling", "availability", "mu", "downlink_compressor", "aggregation",
                   "selection", "candidates")
"""The federated methods' flags (``--clients-per-round`` ...), each a constructor keyword."""


def add_federated_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of the federated methods (docs/algorithms/fedavg.md), for optimize.py and train.py."""
    f = parser.add_argument_group(
        "federated (fedavg, fedprox, fedadam, fedyogi, fedadagrad, scaffold, fedadamw, fedadam-ssm, "
        "cada, g-cada, feddyn, fednova: node 0 "
        "of a star is the server, the other --nodes the clients; the default topology is then star)")
    f.add_argument("--clients-per-round", type=positive_int, default=None,
                   help="clients sampled per round (default: all)")
    f.add_argument("--local-steps", type=int, default=None,
                   help="local steps K per round (>= 1; default 5)")
    f.add_argument("--server-optimizer", default=None,
                   help="sgd (fedavg's default), adam, yogi, adagrad or adamw")
    f.add_argument("--server-lr", type=positive_float, default=None,
                   help="server step (default 1 with sgd, 0.01 adaptive)")
    f.add_argument("--sampling", default=None,
                   help="uniform (k distinct clients, default), replacement, weighted (k "
                        "draws with probability proportional to a client's data size), or fair "
                        "(the k least recently drawn)")
    f.add_argument("--aggregation", default=None,
                   help="mean (default) or data: the sampled deltas weighted by the clients' "
                        "data sizes (McMahan et al.)")
    f.add_argument("--downlink-compressor", default=None,
                   help="compressor of the server's messages (default: exact; --compressor is "
                        "the uplink's), against an EF21 copy per client")
    f.add_argument("--availability", type=float, default=None,
                   help="probability a client is online in a round (default 1)")
    f.add_argument("--mu", type=float, default=None, help="FedProx's proximal weight")
    f.add_argument("--selection", default=None,
                   help="sampled (the sampling's draw trains, default) or power (power-of-choice: "
                        "--candidates d are drawn, the --clients-per-round of highest local "
                        "loss train)")
    f.add_argument("--candidates", type=positive_int, default=None,
                   help="power-of-choice's candidates d per round")


def add_overlap_argument(parser: argparse.ArgumentParser) -> None:
    """``--overlap``, for the scripts whose algorithms compute gradients."""
    parser.add_argument("--overlap", action="store_true",
                        help="compute the next gradients while a round's messages travel "
                             "(choco, dpsgd, ecd, c-ecl, choco-amsgrad, accum-adam(w)): the same "
                             "numbers, less wall time when messages are slow (docs/overlap.md)")


def add_hparam_argument(group: Any, examples: str) -> None:
    """``--hparam KEY=VALUE ...``: any constructor argument of the algorithm, by name."""
    group.add_argument("--hparam", action="extend", nargs="+", default=[], metavar="KEY=VALUE",
                       help=f"other hyper-parameters of the algorithm by name, e.g. {examples}; "
                            "numbers, true/false and comma lists of integers are parsed")
