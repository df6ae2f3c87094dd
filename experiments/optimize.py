"""Decentralized optimization of convex problems: distance to the exact optimum per round and bit.

In process:   python experiments/optimize.py --problem least-squares --algorithm lead --compressor lead:2
Compare:      python experiments/optimize.py --compare lead@lead:2 nids@none dpsgd choco@lead:2 --plot p.png
Under MPI:    mpiexec -n 8 python experiments/optimize.py --problem lasso --algorithm prox-lead --compressor lead:2
Trials:       python experiments/optimize.py --compare lead@lead:2 dgd --seeds 0..9 --jobs 2 --plot p.png

The exact optimum x* is computed centrally (scipy / proximal gradient in float64); each record
carries distance_to_optimum = (1/n) Σ ‖x_i − x*‖² / ‖x*‖², the objective at the average model and
its gap to the optimal value, ‖∇f(x̄)‖ and its minimum so far, consensus error, bits per node and
the oracle calls per node (gradients, per-sample gradients, loss values, proximal steps), priced
by ``--cost-weights`` into a ``cost``. Step sizes default to what each
algorithm suggests for the problem (η = 1/L with full gradients, 1/(6 L_max) with sampled ones,
a fifth of that for gradient tracking), so a run with no tuning flag works. Messages are exact
(``none``) unless a compressor is named (``--compressor``, or ``ALG@SPEC`` in ``--compare``), and
labels always name it (``dgd@none``).
"""

from __future__ import annotations

import argparse
import inspect
import logging
import sys
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

# Only what the parser needs is imported here, so --help answers without torch; the run's own
# imports (the algorithms, problems, engine) are in the functions below.
from gossip import catalog  # noqa: E402
from gossip.catalog import DEFAULT_L1, ESTIMATORS  # noqa: E402
from gossip.cli import (  # noqa: E402
    HelpFormatter,
    add_federated_arguments,
    add_hparam_argument,
    add_list_argument,
    add_overlap_argument,
    add_rounds_argument,
    add_run_arguments,
    check_asynchronous,
    check_entries,
    check_hparam_types,
    check_memory,
    checkpoint_options,
    exit_status,
    federated_hparams,
    gamma_value,
    guarded,
    parse_hparams,
    positive_float,
    positive_int,
    run_label,
    setup,
    target_note,
    topology_record,
    torch_dtype,
)
from gossip.cli.trials import add_trials_arguments, check_trials, run_seeds  # noqa: E402

log = logging.getLogger("gossip.optimize")

ALIASES = {"nids": ("lead", {"alpha": 1.0, "gamma_dual": 1.0}, "none"),
           "dgd": ("dpsgd", {}, None),
           "ef-c-gt": ("c-gt", {"error_feedback": True}, None),
           "sgp": ("push-sum", {}, "none")}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=HelpFormatter
    )
    g = p.add_argument_group("problem")
    g.add_argument("--problem", default="least-squares",
                   help=f"what to minimize: {', '.join(catalog.problems())}, or module:function")
    g.add_argument("--dim", type=positive_int, default=200, help="model dimension (synthetic data)")
    g.add_argument("--samples-per-node", type=positive_int, default=200, help="samples per node (synthetic)")
    g.add_argument("--heterogeneity", type=float, default=1.0,
                   help="spread of the node-specific ground truths (0 = identical data model)")
    g.add_argument("--data", default=None,
                   help="a LibSVM-format file instead of synthetic data (split over the nodes)")
    g.add_argument("--partition", default="iid",
                   help="how --data is split: iid, sorted (by label), dirichlet:ALPHA")
    g.add_argument("--l1", type=float, default=None,
                   help=f"L1 weight (default: {', '.join(f'{v:g} {k}' for k, v in DEFAULT_L1.items())})")
    g.add_argument("--l2", type=float, default=None,
                   help="L2 weight (default: 0.1 least squares, 0.05 lasso, 1/N with N the total number "
                        "of samples for logistic and l1-logistic)")
    a = p.add_argument_group("algorithm")
    a.add_argument("--algorithm", default="lead",
                   help=f"{', '.join(trainable() + sorted(ALIASES))} (nids = lead with no "
                        "compression, dgd = dpsgd, ef-c-gt = c-gt with error feedback, sgp = push-sum "
                        "with no compression), or module:Class")
    a.add_argument("--compressor", default=None,
                   help=f"compressor spec: {catalog.compressor_usage()} (default: none, exact "
                        "messages; the same rule as an item of --compare without @COMPRESSOR)")
    a.add_argument("--compare", nargs="+", default=None, metavar="ALG[@COMPRESSOR]",
                   help="run several algorithms, e.g. lead@lead:2 nids dgd choco@lead:2 "
                        "beer@topk:0.1 (no @COMPRESSOR: exact messages, none); plots distance to "
                        "optimum vs rounds and bits")
    a.add_argument("--eta", type=positive_float, default=None,
                   help="step size (default: what the algorithm suggests for the problem, e.g. 1/L "
                        "with full gradients, 1/(6 L_max) sampled, 0.2/L for gradient tracking)")
    a.add_argument("--gamma", type=gamma_value, default=None,
                   help="consensus step (default: the algorithm's suggestion or its own default; "
                        "CHOCO's is sized from the compressor's contraction and the mixing "
                        "weights); 'auto' searches 1, 0.5, 0.2, ..., 0.01 on a tenth of the "
                        "rounds")
    add_hparam_argument(a, "--hparam codec=sign_l1 freeze_step=50 (onebit-adam), --hparam "
                           "period=2 (c-ecl); with --compare, each goes to the runs whose algorithm "
                           "takes it")
    a.add_argument("--alpha", type=float, default=None, help="LEAD's state momentum α")
    a.add_argument("--gamma-dual", type=float, default=None, help="LEAD's dual step γ_dual")
    a.add_argument("--rank", type=positive_int, default=None, help="PowerGossip's rank")
    a.add_argument("--estimator", choices=ESTIMATORS, default="full",
                   help="gradient estimator (sampled ones need a finite-sum problem)")
    a.add_argument("--batch-size", type=positive_int, default=1, help="samples per sampled gradient")
    add_rounds_argument(a, 300, aliases=("--iterations",))
    a.add_argument("--target", type=positive_float, default=1e-8,
                   help="distance to optimum counted as reached in the table")
    add_federated_arguments(p)
    add_run_arguments(p)
    add_overlap_argument(p)
    add_list_argument(p, algorithms=lambda: trainable() + sorted(ALIASES))
    add_trials_arguments(p)
    p.set_defaults(log_every=1, dtype="float64", topology=None)  # ring, or star when federated
    from gossip.config import parse_args_with_config

    return parse_args_with_config(p, argv)  # --config run.toml; flags override it


MEMORY_FLAGS = "--nodes, --dim or --samples-per-node"
DEFAULT_COMPRESSOR = "none"
"""What a run sends when no compressor is named: exact messages, for every algorithm (LEAD and
Prox-LEAD included: with ``none`` they are NIDS and its proximal form, the methods they
compress; a compressor is a choice of the run, as the graph is)."""


def problem_bytes(args: argparse.Namespace, n: int | None) -> dict[str, float]:
    """What the problem allocates on every process besides the engine: the synthetic data of all
    nodes (in the run's dtype and as the solver's float64 copy) and the solver's d x d matrix
    (least squares, lasso, and logistic up to the dimension of its dense Newton steps)."""
    if args.data is not None:  # the file's own size bounds it, checked by its loader
        return {}
    from gossip.problems.solvers import NEWTON_MAX_DIM

    n = n or args.nodes or 8
    entries = float(n) * args.samples_per_node * (args.dim + 1)
    itemsize = 8 if args.dtype == "float64" else 4
    out = {"problem data (all nodes' samples)": entries * (itemsize + 8)}
    if "logistic" not in args.problem or args.dim <= NEWTON_MAX_DIM:
        out["the optimum's solver (a dim x dim matrix)"] = 2.0 * args.dim * args.dim * 8
    return out


def run_specs(args: argparse.Namespace) -> list[tuple[str, str, dict, str]]:
    """(label, algorithm, hyper-parameters, compressor) for each run asked for.

    One rule for ``--algorithm X`` and ``--compare X``: the compressor named (``--compressor``,
    or ``X@SPEC``), else ``none``: a default never turns an exact method into a compressed one.
    The label names the compressor either way (``dpsgd@none``; an alias keeps its name,
    ``nids@none``)."""
    from gossip.algorithms import algorithm_class

    items = args.compare or [args.algorithm + (f"@{args.compressor}" if args.compressor else "")]
    out = []
    for item in items:
        head, _, comp = item.partition("@")
        name = head
        hp: dict = {}
        if name in ALIASES:
            name, hp, forced = ALIASES[name]
            hp = dict(hp)
            comp = forced or comp
        check_asynchronous(args, name)
        try:
            cls = algorithm_class(name)
        except ValueError as exc:
            raise SystemExit(f"--algorithm/--compare '{item}': {exc}") from None
        if not cls.trains:  # it would average x0 and never move: distance 1 every round
            raise SystemExit(f"--algorithm/--compare '{item}': {name} uses no gradients, so it cannot "
                             f"minimize a problem; use one of "
                             f"{', '.join(trainable())}")
        comp = comp or DEFAULT_COMPRESSOR
        out.append((f"{head}@{comp}", name, hp, comp))
    return out


def trainable() -> list[str]:
    """Registered algorithms that use gradients (``trains``): the ones that can minimize."""
    return catalog.algorithms(lambda t: t.trains)


def hyperparameters(name: str, base: dict, args: argparse.Namespace, problem, topology=None) -> dict:
    """Keyword hyper-parameters for ``name``: flags first, then the problem's recommendations."""
    from gossip.algorithms import accepted_hparams, algorithm_class
    from gossip.cli import FEDERATED_FLAGS

    cls = algorithm_class(name)
    # a suggestion that depends on a given hyper-parameter (LED's step on its local_steps)
    # takes it as a keyword of the same name
    takes = set(inspect.signature(cls.suggest_hparams).parameters) - {"problem", "estimator",
                                                                      "topology"}
    hp = cls.suggest_hparams(problem, args.estimator, topology,
                             **{k: v for k, v in base.items() if k in takes}) | base
    accepted = accepted_hparams(cls)
    for key, value in (("eta", args.eta), ("gamma", args.gamma), ("alpha", args.alpha),
                       ("gamma_dual", args.gamma_dual), ("rank", args.rank)):
        if key in accepted and key not in base and value is not None:
            hp[key] = value
    given = federated_hparams(args, accepted if not args.compare else set(FEDERATED_FLAGS), name)
    hp |= {k: v for k, v in given.items() if k in accepted}  # --compare: to the runs taking it
    extra = parse_hparams(args.hparam)
    check_hparam_types(name, {k: v for k, v in extra.items() if k in accepted})
    if not args.compare:
        hp = hp | extra  # one algorithm: a key it does not take is refused by name
    else:
        hp = hp | {k: v for k, v in extra.items() if k in accepted}
    if (hp.get("sampling") == "weighted" or hp.get("aggregation") == "data") \
            and hp.get("client_weights") is None:  # by the clients' data sizes
        hp["client_weights"] = [problem.n_samples(i) for i in range(problem.n_nodes)]  # data sizes
    return hp


def federated_runs(args: argparse.Namespace) -> bool:
    """Whether the runs asked for are federated (all of them: a star with node 0 the server)
    or none; the default topology follows (star or ring)."""
    specs = run_specs(args)
    from gossip.algorithms import algorithm_class

    kinds = {algorithm_class(name).federated for _, name, _, _ in specs}
    if len(kinds) > 1:
        raise SystemExit("error: --compare mixes federated algorithms (on the star) with "
                         "decentralized ones (on --topology); compare each family in its own run")
    return kinds == {True}


def check(argv: list[str] | None = None) -> None:
    """Parse and build every run ``argv`` asks for, then stop (compare.py's check of a sweep
    entry before any entry runs); a run that cannot start raises ``SystemExit`` with its
    ``error:`` line."""
    main(argv, check_only=True)


COSTS = [("grads", "grads/node"), ("cost", "cost")]
"""Table columns of the work to the target besides bits (row key, header): gradient
estimates per node (where the oracles count them), the ``--cost-weights`` cost."""


def format_table(rows: list[dict], target: float, clocks: list[tuple[str, str]],
                 federated: bool = False) -> str:
    """The runs' markdown table: final distance, rounds, bits and, for runs on a clock
    (``clocks``: virtual time of the network's timing models, wall time of ``--free-run``),
    the seconds each took to reach ``target``. ``federated``: the bits each client sent up and
    received down (counted from the bytes) instead of the mean over nodes and server. Rows
    with ``grads`` / ``cost`` keys (:data:`COSTS`) get those columns to the target too."""
    bits = [("bits_up", "bits up/client"), ("bits_down", "bits down/client")] if federated \
        else [("bits", "bits/node")]
    bits += [(k, h) for k, h in COSTS if any(k in r for r in rows)]
    heads = [f"rounds to {target:g}", *(f"{h} to {target:g}" for _, h in bits),
             *(f"{h} to {target:g}" for _, h in clocks)]
    lines = ["| run | final distance to x* | " + " | ".join(heads) + " | ms/round | status |",
             "|---|---|" + "---|" * len(heads) + "---|---|"]
    for r in rows:
        missed = r["rounds"] is None
        cells = ["not reached"] * len(heads) if missed else [
            str(r["rounds"]), *("—" if r.get(k) is None else format(r[k], ".3g") for k, _ in bits),
            *("—" if r[k] is None else format(r[k], ".4g") for k, _ in clocks)]
        lines.append(f"| {r['run']} | {r['final']:.3g} | " + " | ".join(cells)
                     + f" | {r['ms']:.3f} | {r['status']} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None, check_only: bool = False) -> list[dict]:
    """Run what ``argv`` asks for, print its table (and plot), and return the table's rows
    (with ``--seeds``: every trial's rows, each with its ``seed``)."""
    args = parse_args(argv)
    check_trials(args)
    if args.seeds is not None and not check_only:  # one process per trial, each trial(args)
        return run_seeds(
            args, __file__, metric="distance_to_optimum",
            final=("final", "final distance to x*"), reached="rounds", ms="ms",
            columns=[("rounds", "rounds"), ("bits", "bits/node"),
                     *((k, h) for k, h in COSTS if k != "cost" or args.cost_weights)],
            title=args.problem, target=args.target)
    return run(args, check_only)[0]


def trial(args: argparse.Namespace) -> list[dict]:
    """One trial of ``--seeds`` (in its own process): the run of ``args`` (one seed, writing
    its records to ``args.out``), without its table."""
    return run(args, report=False)[0]


def run(args: argparse.Namespace, check_only: bool = False, report: bool = True
        ) -> tuple[list[dict], dict[str, list[dict]]]:
    """The runs of ``args``: their table rows and round records by label (``report``: print
    the table and write the plot)."""
    federated = federated_runs(args)
    if args.topology is None:
        args.topology = "star" if federated else "ring"
    from gossip.algorithms import form_class, make_algorithm
    from gossip.engine import Engine
    from gossip.errors import GossipError
    from gossip.metrics import (
        JsonlLogger,
        first_reach,
        gradient_metric,
        squared_distance,
        versions,
    )
    from gossip.outputs import CLOCKS, clocks_of
    from gossip.problems import default_hparams, make_problem
    from gossip.problems.oracles import OracleFactory
    from gossip.runner import execute
    from gossip.tuning import tune_gamma

    specs = run_specs(args)

    def memory(world, topology=None) -> None:
        check_memory(args, world, numel=args.dim, algorithms=[form_class(s[1], s[2]) for s in specs],
                     compressors=[s[3] for s in specs], lower=MEMORY_FLAGS, topology=topology,
                     nodes=args.nodes, extra=problem_bytes(args, topology.n if topology else None))

    world, topology = setup(args, before_topology=memory)
    memory(world, topology)
    dtype = torch_dtype(args.dtype)
    if args.data is not None:
        from gossip.config import user_file
        from gossip.errors import ConfigFileError

        try:
            user_file(args.data, "--data")
        except ConfigFileError as exc:
            raise SystemExit(f"error: {exc}") from None
    try:
        problem = make_problem(  # federated: the clients hold the data, node i client i − 1
            args.problem, n_nodes=topology.n - federated, dim=args.dim, samples_per_node=args.samples_per_node,
            heterogeneity=args.heterogeneity, seed=args.seed, data=args.data,
            partition_scheme=args.partition, l1=args.l1, l2=args.l2, dtype=dtype, device=args.device,
        )
    except GossipError as exc:
        raise SystemExit(f"--problem {args.problem}: {exc}") from None
    x_star = problem.solution()
    f_star = problem.optimal_value()
    x0 = problem.initial_point()

    def metrics(engine, xbar):
        obj = problem.objective(xbar)
        return {"distance_to_optimum": squared_distance(engine, x_star),
                "objective": obj, "suboptimality": obj - f_star} | gradient_metric(engine, xbar)

    norm_star = float((x_star**2).sum()) or 1.0

    def node_metrics(i, x):  # a free run's node records: what node i knows alone
        return {"distance_to_optimum": float(((x - x_star) ** 2).sum()) / norm_star,
                "loss": problem.local_loss(i - federated, x)}

    factory = OracleFactory(problem, args.estimator, args.batch_size)  # (a block's at once if it can)
    oracles = factory if not federated else (  # the server (node 0) has none
        lambda i, gen: None if i == 0 else factory(i - 1, gen))

    def builder(name: str, hp: dict, comp: str) -> Callable[[float | None], Engine]:
        def build(gamma: float | None) -> Engine:
            kw = hp if gamma is None else hp | {"gamma": gamma}
            if kw.get("gamma") == "auto":  # a check before the search: the algorithm's default
                kw = {k: v for k, v in kw.items() if k != "gamma"}
            return Engine(
                make_algorithm(name, **kw), topology, lambda i: x0, compressor=comp,
                seed=args.seed, world=world, device=args.device,
                network=args.network, overlap=args.overlap,
                dtype=dtype, watch=("distance_to_optimum",),
                free_run=args.free_run,
                oracles=oracles,
            )
        return build

    planned = [(label, name, comp, hyperparameters(name, base_hp, args, problem, topology))
               for label, name, base_hp, comp in specs]
    builds = [builder(name, hp, comp) for _, name, comp, hp in planned]
    if check_only or len(planned) > 1:  # every entry before the first run
        check_entries([(label, lambda b=b: b(None)) for (label, *_), b in zip(planned, builds)],
                      "--compare" if args.compare else "--algorithm")
    if check_only:
        return [], {}
    logger = JsonlLogger(args.out, enabled=world.is_root)
    rows, curves = [], {}
    for index, ((label, name, comp, hp), build) in enumerate(zip(planned, builds)):
        search = None
        if hp.get("gamma") == "auto":
            search = tune_gamma(build, max(1, args.rounds // 10), "distance_to_optimum",
                                [metrics])
            hp["gamma"] = search.pick
            if world.is_root:
                print(f"{label}: {search.describe()}")
        try:
            engine = build(None)  # the oracles check --estimator / --batch-size against the data
        except ValueError as exc:
            raise SystemExit(f"error: {exc}") from None
        head, _, sent = label.partition("@")
        given = {k: v for k, v in parse_hparams(args.hparam).items() if k in hp}
        label = run_label(head, getattr(engine.algorithm, "codec", None) or sent or None, given)
        config = {"script": "optimize", "args": vars(args), "algorithm": name,
                  "hparams": engine.hparams, "compressor": comp, "nodes": topology.n,
                  "world_size": world.size, "topology": topology_record(topology),
                  "problem": args.problem, "smoothness": default_hparams(problem, args.estimator),
                  "optimal_value": f_star, "versions": versions()}
        if search is not None:
            config["gamma_search"] = search.record()
        result = execute(engine, label=label, config=config, logger=logger,
                         rounds=args.rounds, log_every=args.log_every, metrics=[metrics],
                         node_metrics=[node_metrics], cost_weights=args.cost_weights,
                         progress=args.progress, **checkpoint_options(args, index))
        curves[label] = result.records
        reached = first_reach(result.records, "distance_to_optimum", args.target)
        last = result.records[-1] if result.records else {}  # none: diverged before round 0's
        rows.append({"run": label, "final": last.get("distance_to_optimum", float("nan")),
                     "rounds": reached["round"] if reached else None,
                     "bits": reached["bits_per_node"] if reached else None,
                     **({"bits_up": reached["bits_up_per_client"] if reached else None,
                         "bits_down": reached["bits_down_per_client"] if reached else None}
                        if federated else {}),
                     **{key: (reached or {}).get(key) for key, _ in CLOCKS},  # seconds to target
                     **({"grads": (reached or {}).get("grads_per_node")}
                        if "grads_per_node" in last else {}),
                     **({"cost": (reached or {}).get("cost")} if args.cost_weights else {}),
                     # the steady rounds' (setup, first round and metrics apart: Engine.summary)
                     "ms": 1e3 * (result.summary.get("steady_s_per_round")
                                  or result.summary["seconds_per_round"]),
                     "setup_s": result.summary.get("setup_s"),
                     "first_round_s": result.summary.get("first_round_s"),
                     "status": result.status,
                     "last_round": last.get("round")})
    logger.close()
    if world.is_root and report:
        print(format_table(rows, args.target, clocks_of(curves.values()), federated))
        note = target_note([(r["run"], r["last_round"]) for r in rows if r["rounds"] is None],
                           args.target, "distance to x*")
        if note:
            print(note)
        if args.plot:
            from gossip.plot import plot_runs

            plot_runs(curves, args.plot, metric="distance_to_optimum",
                      title=f"{args.problem} on {topology.name}, n={topology.n}", flag="--plot")
    return rows, curves


if __name__ == "__main__":
    guarded(lambda: exit_status(main()), memory_hint=MEMORY_FLAGS)
