"""What lost messages do to each method: the loss-rate table of docs/network.md (issue 23).

Every run is 16 nodes on a ring, in this process, float64, for ``--rounds`` rounds, on each
network of ``NETWORKS``: no loss, Bernoulli loss ``p`` in {0.01, 0.1, 0.3} (``--network
loss=p``) and Gilbert-Elliott bursts ``loss=ge:p_gb=0.02,p_bg=0.18`` (a lost message in the bad
state, none in the good one: stationary loss rate 0.02 / (0.02 + 0.18) = 0.1, bursts of
1 / 0.18 ≈ 5.6 rounds on average). Each setting runs once per ``--seeds`` seed (the scripts'
``--seed``: it draws the data, the initial vectors and the losses), and the table gives the
median over the seeds of every column.

Averaging (what ``experiments/consensus.py --algorithm A --compressor none --nodes 16 --dim 100
--rounds T --network N --seed S --dtype float64`` runs, push-sum with ``--weights push``;
x_i⁰ ~ N(0, I) in d = 100):

* ``gossip`` with Metropolis weights (1/3 on the ring; a lost message renormalizes: its weight
  goes to the receiver's own value);
* ``push-sum`` with ``--compressor none`` on the same ring built with ``--weights push`` (each
  node splits its mass equally over itself and its out-neighbors: column-stochastic, here the
  same matrix as gossip's; push-sum needs a column-stochastic matrix, and a ring's is the
  simplest; a lost share stays at its sender, so Σ s and Σ w are kept);
* ``powergossip`` (rank 1, γ = 1) on the same vectors as 10×10 matrices (``--shape 10x10``:
  the same numbers; PowerGossip sketches matrices), Metropolis weights (an edge either of
  whose messages is lost sits the round out at both ends, so the average is kept).

Columns: the consensus error (1/n) Σ‖x_i − x̄‖² relative to its round-0 value, the drift of
the average ‖x̄_T − x̄_0‖ / ‖x̄_0‖, the worst node's error to the exact average
max_i ‖x_i − x̄_0‖ / ‖x̄_0‖, the messages lost in all, the bits each node sent (delivered
messages only: a lost message moves no bytes) and their ratio to the same method without loss.

Optimization (what ``experiments/optimize.py --nodes 16 --dim 50 --samples-per-node 50
--heterogeneity 1 --rounds T --algorithm A --compressor C --network N --seed S --dtype
float64`` runs: heterogeneous least squares, full gradients, x⁰ = 0, each method's own
suggested step sizes): D-PSGD (``dpsgd``, exact messages), CHOCO-SGD with ``topk:0.1`` and with
``none``, the same with a copy per arc (``choco-arcs``: a lost message changes neither end's
copy), LEAD with its own ``lead:2`` quantizer, C-GT with ``none`` (exact messages, so every
error beyond the no-loss run is the loss's), and LEAD and C-GT with a copy per arc
(``lead-arcs``, ``c-gt-arcs``: the same compressors; a lost message changes neither end's
copy), BEER with ``topk:0.1`` and Prox-LEAD with ``lead:2``, plain and with their copies
per arc (``beer-arcs``, ``prox-lead-arcs``); Prox-LEAD needs a regularizer, so its runs are
``--problem lasso`` with the same sizes and seed (sparse truths, ``0.025‖x‖²`` and an L1 term:
docs/experiments.md#lasso), x* that problem's. Also EXTRA (``extra``, exact messages; a lost
message drops its edge from the round's W at both ends) and C-ECL with ``randk:0.2``
exchanging its duals every round (``--hparam period=1``, as every other method here exchanges
every round; a lost dual update moves neither the receiver's dual nor the sender's mirror of
it), and the adaptive DADAM (``dadam``: models averaged in, renormalized) and tracked AMSGrad
(``tracked-amsgrad``: a lost message drops its edge at both ends, so its tracker keeps the
mean second moment). The methods of issue 41, all with exact messages (``none``) and their
suggested steps: adapt-then-combine DGD (``atc-dgd``: models averaged in, renormalized), the
trackers ATC-DIGing and NEXT, exact diffusion and LED, decentralized ADMM and DLM, GT-SAGA and
GT-SARAH (sampled rows of the same least squares, their default batch B = 1: its rows are its
finite sum), K-GT and decentralized Scaffnew (local steps); each of these but ATC-DGD drops an
edge whose message is lost at both ends (``edge``). Columns: the distance to the optimum
(1/n) Σ‖x_i − x*‖² / ‖x*‖² at round T and at round T/2 (a value still growing from T/2 to T
is a run drifting away), the consensus error (1/n) Σ‖x_i − x̄‖² / ‖x*‖², the messages lost,
the bits per node and their ratio to the method's no-loss run.

    python benchmarks/bench_loss.py                    # the docs' table
    python benchmarks/bench_loss.py --rounds 5 --seeds 0   # does it run
    python benchmarks/bench_loss.py --methods choco-arcs   # only these algorithms' rows
    python benchmarks/bench_loss.py --methods lead-arcs c-gt-arcs
    python benchmarks/bench_loss.py --methods beer beer-arcs prox-lead prox-lead-arcs
    python benchmarks/bench_loss.py --methods powergossip extra c-ecl
    python benchmarks/bench_loss.py --methods dadam tracked-amsgrad
    python benchmarks/bench_loss.py --methods atc-dgd atc-diging next exact-diffusion led \
        admm dlm gt-saga gt-sarah k-gt scaffnew

``--networks stale`` measures late messages instead (the lag table of docs/network.md): the
same runs on ``STALE_NETWORKS``, ideal, every message 1 or 3 rounds late (``stale=1``,
``stale=3``) and geometric lags of mean 1 (``stale=geom:0.5``), for the methods that give a
late message a meaning (the methods that drop their edge, ``on_loss`` "edge": PowerGossip,
EXTRA, ..., are refused under ``stale=`` and left out; those whose lost messages are
acknowledged, "ack": the ``-arcs`` ones and C-ECL, have the ``--networks ack`` table instead);
"messages late" counts the messages handed over after their round.

    python benchmarks/bench_loss.py --networks stale

``--networks ack`` measures the acknowledged per-arc copies under lost and late messages
together (``ACK_NETWORKS``: ideal, ``loss=0.1``, ``stale=geom:0.5`` and both), the methods of
``ACK_OPTIMIZERS`` with top-10 % (LEAD's dual step 0.1 on every network, ``ACK_HPARAMS``):

    python benchmarks/bench_loss.py --networks ack --rounds 3000 --methods lead-arcs

``--only SPEC ...`` keeps only those networks of the set (e.g. ``--only
"loss=0.1;stale=geom:0.5"``; "bits vs" is then "—" unless the reference ``none`` is named);
``--jobs N`` runs a setting's seeds in N processes at once.

``--networks noise`` measures a noisy channel (``NOISE_NETWORKS``: Gaussian noise of variance
1e-8 and 1e-4 on every delivered message's decoded values) and ``--networks active`` partial
activation (``ACTIVE_NETWORKS``: every node active (``active=1``, the machinery on, the plain
run's numbers), each node active with probability 0.9 or 0.5 per round, and a two-state
chain per node of stationary activity 1/2 and mean stays of 10 rounds); "messages lost"
counts only the loss model's (none here: a silent arc of an inactive node is not counted, and
moves no bits). A setting the engine refuses (PowerGossip's and push-sum's raw rows under
noise) is left out with a line on stderr.

    python benchmarks/bench_loss.py --networks noise --methods gossip dpsgd choco extra lead
    python benchmarks/bench_loss.py --networks active --rounds 300 \
        --methods gossip push-sum dpsgd choco extra lead lead-arcs
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import topologies  # noqa: E402
from gossip import Engine, make_algorithm  # noqa: E402
from gossip.algorithms import algorithm_class  # noqa: E402
from gossip.errors import ConfigError, DivergenceError  # noqa: E402
from gossip.layout import Layout  # noqa: E402
from gossip.metrics import squared_distance  # noqa: E402
from gossip.problems import make_problem  # noqa: E402
from gossip.rng import generator, init_seed  # noqa: E402

NODES = 16
NETWORKS = ("none", "loss=0.01", "loss=0.1", "loss=0.3", "loss=ge:p_gb=0.02,p_bg=0.18")
"""The ``--network`` specs, the first the reference (no loss)."""
STALE_NETWORKS = ("none", "stale=1", "stale=3", "stale=geom:0.5")
"""The late-message specs (``--networks stale``), the first the reference."""
NOISE_NETWORKS = ("none", "noise=var:1e-8", "noise=var:1e-4")
"""The noisy-channel specs (``--networks noise``), the first the reference."""
ACK_NETWORKS = ("none", "loss=0.1", "stale=geom:0.5", "loss=0.1;stale=geom:0.5")
"""Lost and late messages together (``--networks ack``), the first the reference."""
ACK_OPTIMIZERS = (("lead-arcs", "topk:0.1"), ("c-gt-arcs", "topk:0.1"))
"""(algorithm, compressor) of the ``--networks ack`` runs: the acknowledged per-arc copies."""
ACK_HPARAMS = {"lead-arcs": {"gamma_dual": 0.1}}
"""Hyper-parameters of the ``--networks ack`` runs beyond :data:`HPARAMS`, on every network of
the set (LEAD's dual step: 0.5 with top-k diverges under lags of mean 1)."""
ACTIVE_NETWORKS = ("none", "active=1", "active=0.9", "active=0.5",
                   "active=markov:p_off=0.1,p_on=0.1")
"""The partial-activation specs (``--networks active``), the first the reference."""
AVERAGING = (("gossip", "none"), ("push-sum", "none"), ("powergossip", "none"))
"""(algorithm, compressor) of the consensus runs."""
OPTIMIZERS = (("dpsgd", "none"), ("choco", "topk:0.1"), ("choco", "none"),
              ("choco-arcs", "topk:0.1"), ("choco-arcs", "none"), ("lead", "lead:2"),
              ("lead-arcs", "lead:2"), ("c-gt", "none"), ("c-gt-arcs", "none"),
              ("beer", "topk:0.1"), ("beer-arcs", "topk:0.1"), ("prox-lead", "lead:2"),
              ("prox-lead-arcs", "lead:2"), ("extra", "none"), ("c-ecl", "randk:0.2"),
              ("dadam", "none"), ("tracked-amsgrad", "none"), ("atc-dgd", "none"),
              ("atc-diging", "none"), ("next", "none"), ("exact-diffusion", "none"),
              ("led", "none"), ("admm", "none"), ("dlm", "none"), ("gt-saga", "none"),
              ("gt-sarah", "none"), ("k-gt", "none"), ("scaffnew", "none"))
"""(algorithm, compressor) of the least-squares runs (the lasso for :data:`LASSO`)."""
LASSO = ("prox-lead", "prox-lead-arcs")
"""The methods that need a regularizer: they run on the lasso of the same sizes and seed."""
HPARAMS = {"c-ecl": {"period": 1}}
"""Hyper-parameters beyond the suggested ones (the scripts' ``--hparam``)."""
SHAPES = {"powergossip": (10, 10)}
"""The consensus vectors' matrix shape per algorithm (the scripts' ``--shape``)."""
NOT_LATE = ("ack", "edge")
"""The ``on_loss`` of the methods left out of the lag table (``"edge"``: refused under
``stale=``; ``"ack"``: measured in the ``--networks ack`` table instead)."""
CONSENSUS_DIM = 100
LSQ_DIM, LSQ_SAMPLES, LSQ_HETEROGENEITY = 50, 50, 1.0

EXTRA_HPARAMS: dict[str, dict] = {}
"""The hyper-parameters of the chosen network set beyond :data:`HPARAMS` (set by :func:`main`)."""

Row = dict[str, float]
Results = dict[tuple[str, str, str], list[Row]]
"""(algorithm, compressor, network) -> one row per seed."""


def _norm(x: torch.Tensor) -> float:
    return float(torch.linalg.vector_norm(x))


def _losses(engine: Engine) -> dict[str, float]:
    rec = engine.record()
    return {"lost": float(rec.get("messages_lost_total", 0)),
            "late": float(rec.get("messages_late_total", 0)), "bits": rec["bits_per_node"]}


def averaging_run(algorithm: str, compressor: str, network: str, seed: int, rounds: int) -> Row:
    """One consensus run (the scripts' Gaussian x_i⁰ of ``seed``): its row of the table."""
    weights = "push" if algorithm == "push-sum" else "metropolis"
    topo = topologies.build("ring", NODES, weights=weights)

    def x0(i: int) -> torch.Tensor:
        return torch.randn(CONSENSUS_DIM, generator=generator(init_seed(seed, i)),
                           dtype=torch.float64)

    shape = SHAPES.get(algorithm)
    engine = Engine(make_algorithm(algorithm), topo, x0, compressor=compressor, seed=seed,
                    network=network, dtype=torch.float64,
                    layout=None if shape is None else Layout([shape]))
    start = torch.stack([x0(i) for i in range(NODES)])
    mean0 = start.mean(0)
    error0 = float(((start - mean0) ** 2).sum(1).mean())
    engine.run(rounds, log_every=max(rounds, 1))
    x = engine.block.x
    mean = engine.mean_model()
    return {"consensus": float(((x - mean) ** 2).sum(1).mean()) / error0,
            "drift": _norm(mean - mean0) / _norm(mean0),
            "exact": max(_norm(row - mean0) for row in x) / _norm(mean0),
            **_losses(engine)}


def optimization_run(algorithm: str, compressor: str, network: str, seed: int, rounds: int) -> Row:
    """One least-squares run (lasso for :data:`LASSO`), as experiments/optimize.py builds it:
    its row of the table."""
    topo = topologies.build("ring", NODES)
    kind = "lasso" if algorithm in LASSO else "least-squares"
    problem = make_problem(kind, n_nodes=NODES, dim=LSQ_DIM,
                           samples_per_node=LSQ_SAMPLES, heterogeneity=LSQ_HETEROGENEITY,
                           seed=seed, dtype=torch.float64)
    x_star, x0 = problem.solution(), problem.initial_point()
    hp = algorithm_class(algorithm).suggest_hparams(problem, "full", topo) | HPARAMS.get(algorithm, {})
    if EXTRA_HPARAMS:
        hp |= EXTRA_HPARAMS.get(algorithm, {})
    engine = Engine(make_algorithm(algorithm, **hp), topo, lambda i: x0, compressor=compressor,
                    seed=seed, network=network, dtype=torch.float64,
                    watch=("distance_to_optimum",),
                    oracles=lambda i, gen: problem.oracle(i, gen, "full", 1))
    half = rounds // 2
    mid = math.inf
    try:
        engine.run(half, log_every=max(half, 1))
        mid = squared_distance(engine, x_star)
        engine.run(rounds - half, log_every=max(rounds - half, 1))
    except DivergenceError:  # a late message can make a method diverge: the table says so
        return {"distance": math.inf, "distance_half": mid, "consensus": math.inf,
                "lost": math.nan, "late": math.nan, "bits": math.nan}
    x = engine.block.x
    return {"distance": squared_distance(engine, x_star), "distance_half": mid,
            "consensus": float(((x - engine.mean_model()) ** 2).sum(1).mean()) / _norm(x_star) ** 2,
            **_losses(engine)}


def _median(rows: list[Row], key: str) -> float:
    """The median over the seeds (a diverged run counts as +inf; nan: no run finished)."""
    done = [r[key] for r in rows if not math.isnan(r[key])]
    return statistics.median(done) if done else math.nan


def _cell(value: float, form: str) -> str:
    """A median as the table writes it ("diverged": most seeds diverged; "—": none finished)."""
    if math.isinf(value):
        return "diverged"
    return "—" if math.isnan(value) else format(value, form)


def _ratio(results: Results, key: tuple[str, str, str], rows: list[Row]) -> str:
    if (key[0], key[1], "none") not in results:  # the reference was not run (--only)
        return "—"
    ref = _median(results[(key[0], key[1], "none")], "bits")
    return _cell(_median(rows, "bits") / ref, ".3f") if ref > 0 else "—"


def _table(results: Results, columns: list[tuple[str, str]], late: bool = False) -> str:
    """Method, compressor, network, the ``(header, key)`` columns (medians over the seeds,
    3 significant digits), then the messages lost (``late``: held late) and the bits."""
    head = "".join(f" {h} |" for h, _ in columns)
    count, ideal = ("late", "no lag") if late else ("lost", "no loss")
    lines = [f"| method | compressor | network |{head} messages {count} | bits/node | "
             f"bits vs {ideal} |",
             "|---|---|---|" + "---|" * (len(columns) + 3)]
    for key, rows in results.items():
        cells = "".join(f" {_cell(_median(rows, k), '.3g')} |" for _, k in columns)
        lines.append(f"| {key[0]} | {key[1]} | {key[2]} |{cells} "
                     f"{_cell(_median(rows, count), '.0f')} | {_cell(_median(rows, 'bits'), '.4g')} "
                     f"| {_ratio(results, key, rows)} |")
    return "\n".join(lines)


def averaging_table(results: Results, late: bool = False) -> str:
    """The averaging table of docs/network.md (medians over the seeds)."""
    return _table(results, [("consensus error (rel.)", "consensus"), ("drift of the average", "drift"),
                            ("error to the exact average (worst node)", "exact")], late)


def optimization_table(results: Results, rounds: int, late: bool = False) -> str:
    """The least-squares table of docs/network.md (medians over the seeds)."""
    return _table(results, [(f"distance to x* (rel.), round {rounds}", "distance"),
                            (f"at round {rounds // 2}", "distance_half"),
                            ("consensus error (rel.)", "consensus")], late)


def measure(run: Callable[[str, str, str, int, int], Row], methods: Iterable[tuple[str, str]],
            seeds: list[int], rounds: int, networks: tuple[str, ...] = NETWORKS,
            jobs: int = 1) -> Results:
    """Every (method, network) setting over every seed (``jobs`` > 1: the seeds of a setting
    in that many processes at once, each with one torch thread)."""
    results: Results = {}
    pool = None
    if jobs > 1:
        import multiprocessing

        pool = multiprocessing.get_context("fork").Pool(jobs)
    for algorithm, compressor in methods:
        for network in networks:
            try:
                if pool is None:
                    rows = [run(algorithm, compressor, network, seed, rounds) for seed in seeds]
                else:
                    rows = pool.starmap(run, [(algorithm, compressor, network, seed, rounds)
                                              for seed in seeds])
            except ConfigError as exc:  # refused by the engine: no row
                print(f"refused: {algorithm} {compressor} {network}: {exc}", file=sys.stderr)
                continue
            if any(math.isnan(v) and k != "late" and k != "lost" and k != "bits"
                   for r in rows for k, v in r.items()):
                raise SystemExit(f"{algorithm} {compressor} {network}: a NaN result")
            results[(algorithm, compressor, network)] = rows
        print(f"done: {algorithm} {compressor}", file=sys.stderr, flush=True)
    if pool is not None:
        pool.close()
    return results


def main(argv: list[str] | None = None) -> str:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=1000, help="rounds per run")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="run seeds (median)")
    p.add_argument("--methods", nargs="+", metavar="ALGORITHM",
                   help="only the rows of these algorithms (default: every one)")
    p.add_argument("--networks", choices=("loss", "stale", "noise", "active", "ack"),
                   default="loss",
                   help="lost messages (NETWORKS), late ones (STALE_NETWORKS), a noisy channel "
                        "(NOISE_NETWORKS), partial activation (ACTIVE_NETWORKS) or lost and late "
                        "ones on acknowledged per-arc copies (ACK_NETWORKS)")
    p.add_argument("--jobs", type=int, default=1,
                   help="processes that run a setting's seeds at once (default 1)")
    p.add_argument("--only", nargs="+", metavar="SPEC",
                   help="only these networks of the set (the reference too when named)")
    args = p.parse_args(argv)
    late = args.networks in ("stale", "ack")
    networks = {"loss": NETWORKS, "stale": STALE_NETWORKS, "noise": NOISE_NETWORKS,
                "active": ACTIVE_NETWORKS, "ack": ACK_NETWORKS}[args.networks]
    if args.only:
        unknown = sorted(set(args.only) - set(networks))
        if unknown:
            raise SystemExit(f"--only {' '.join(unknown)}: not in the set ({', '.join(networks)})")
        networks = tuple(n for n in networks if n in args.only)
    EXTRA_HPARAMS.clear()
    if args.networks == "ack":
        EXTRA_HPARAMS.update(ACK_HPARAMS)
    torch.set_num_threads(1)
    start = time.perf_counter()

    def chosen(methods: tuple[tuple[str, str], ...]) -> list[tuple[str, str]]:
        return [m for m in methods if (args.methods is None or m[0] in args.methods)
                and not (late and algorithm_class(m[0]).on_loss in NOT_LATE)]

    averaging_methods, optimizers = chosen(AVERAGING), chosen(OPTIMIZERS)
    if args.networks == "ack":
        averaging_methods = []
        optimizers = [m for m in ACK_OPTIMIZERS if args.methods is None or m[0] in args.methods]
    if not averaging_methods and not optimizers:
        raise SystemExit(f"--methods {' '.join(args.methods)}: none of the benchmark's algorithms "
                         f"({', '.join(dict.fromkeys(a for a, _ in AVERAGING + OPTIMIZERS))})")
    seeds = " ".join(map(str, args.seeds))
    parts = []
    if averaging_methods:
        averaging = averaging_table(measure(averaging_run, averaging_methods, args.seeds,
                                            args.rounds, networks), late)
        parts.append(f"Averaging: {NODES} nodes on a ring, d = {CONSENSUS_DIM}, {args.rounds} "
                     f"rounds, median over seeds {seeds}\n\n{averaging}")
    if optimizers:
        optimization = optimization_table(measure(optimization_run, optimizers, args.seeds,
                                                  args.rounds, networks, args.jobs),
                                          args.rounds, late)
        parts.append(f"Least squares: {NODES} nodes on a ring, d = {LSQ_DIM}, {LSQ_SAMPLES} "
                     f"samples per node, heterogeneity {LSQ_HETEROGENEITY:g}, {args.rounds} "
                     f"rounds, median over seeds {seeds}\n\n{optimization}")
    out = "\n\n".join(parts)
    print(out)
    print(f"\n({time.perf_counter() - start:.0f} s)", file=sys.stderr)
    return out


if __name__ == "__main__":
    main()
