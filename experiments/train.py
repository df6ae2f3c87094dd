"""Decentralized training of a PyTorch model: accuracy, loss and consensus per epoch and per bit.

In process:  python experiments/train.py --algorithm choco --compressor topk:0.01 --gamma 0.05
Tuned γ:     python experiments/train.py --algorithm choco --compressor sign --gamma auto
Under MPI:   mpiexec -n 8 python experiments/train.py --model mlp --partition dirichlet:0.5
From a file: python experiments/train.py --config experiments/configs/train_digits.toml

Every node trains a copy of the model on its part of the data (iid, label-sorted or Dirichlet α)
with its own torch.optim optimizer (D-PSGD, CHOCO-SGD, DeepSqueeze, PowerGossip) or with the
plain gradient (LEAD, BEER), and gossips with its neighbors through the chosen compressor. Each
log record carries train loss, test loss and accuracy of the averaged model, the worst node's
accuracy, consensus error, bits per node and time; the script prints a table row and can plot
accuracy against rounds and bits. One epoch = ceil(N_train / (nodes · batch size)) rounds.
The asynchronous algorithms (AD-PSGD, gossip learning, asynchronous SGP and CHOCO) run in
virtual time, their round a sweep of n activations, each a local step on one mini-batch: an
epoch is then one pass over a node's data on average (docs/asynchronous.md).
Under mpiexec with one node per rank, --free-run SCALE trains in wall-clock order instead: each
local step lasts its --network compute draw x SCALE wall seconds; an asynchronous run logs the
nodes' snapshots at the common wall instants of every --eval-every epochs (written after the
run), a synchronous one its rounds with their wall_s (docs/asynchronous.md, "Training").
Built-in data need no download (scikit-learn's digits, synthetic classes); other data sets are
read from disk (--data FILE.npz / FILE.pt / an ImageFolder directory with torchvision).
"""

from __future__ import annotations

import argparse
import logging
import math
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

# Only what the parser needs is imported here, so --help answers without torch; the run's own
# imports (torch, the trainer, data sets) are in the functions below.
from gossip import catalog  # noqa: E402
from gossip.catalog import MODELS, NORMS, OPTIMIZERS, SCHEDULES  # noqa: E402
from gossip.cli import (  # noqa: E402
    HelpFormatter,
    add_federated_arguments,
    add_hparam_argument,
    add_list_argument,
    add_overlap_argument,
    add_rounds_argument,
    add_run_arguments,
    check_asynchronous,
    check_hparam_types,
    check_memory,
    checkpoint_options,
    exit_status,
    federated_hparams,
    guarded,
    non_negative_float,
    parse_hparams,
    positive_float,
    positive_int,
    run_label,
    setup,
    topology_record,
    torch_dtype,
)

if TYPE_CHECKING:
    import torch

    from gossip.training import DecentralizedTrainer

log = logging.getLogger("gossip.train")


def gamma_value(text: str) -> float | str:
    """a number or 'auto'"""
    if text.strip().lower() == "auto":
        return "auto"
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number or 'auto', got {text!r}") from None


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    optimizer_algorithms = catalog.algorithms(lambda t: t.trains and t.takes_optimizer)
    trainable_algorithms = catalog.algorithms(lambda t: t.trains)
    tunable = catalog.algorithms(lambda t: "gamma" in t.tunable)  # gossip.tuning.tunable_algorithms()
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=HelpFormatter
    )
    d = p.add_argument_group("data")
    d.add_argument("--data", default="digits",
                   help="digits (scikit-learn, 8x8, 10 classes), synthetic, or a path: a .npz/.pt "
                        "file of tensors (x, y or x_train, y_train, x_test, y_test) or an "
                        "ImageFolder directory (needs torchvision). Nothing is downloaded")
    d.add_argument("--test-fraction", type=float, default=0.2,
                   help="share of the data held out for testing when the data has no test split")
    d.add_argument("--synthetic-samples", type=positive_int, default=2000, help="samples (synthetic data)")
    d.add_argument("--synthetic-features", type=positive_int, default=32, help="features (synthetic data)")
    d.add_argument("--synthetic-classes", type=positive_int, default=10, help="classes (synthetic data)")
    d.add_argument("--synthetic-separation", type=non_negative_float, default=1.0,
                   help="spread of the class means (synthetic data; larger is easier)")
    d.add_argument("--partition", default="iid",
                   help="split of the training set over the nodes: iid, sorted (by label), "
                        "dirichlet:ALPHA (smaller ALPHA = more skewed)")
    d.add_argument("--batch-size", type=positive_int, default=32,
                   help="mini-batch per node and round (per local step of an asynchronous "
                        "algorithm)")
    d.add_argument("--eval-batch-size", type=positive_int, default=1024, help="batch size of evaluations")
    d.add_argument("--node-eval-samples", type=positive_int, default=None,
                   help="test samples each node's own model is evaluated on for the worst-node "
                        "accuracy (default: the whole test set)")
    d.add_argument("--eval-train", action="store_true",
                   help="also log the averaged model's loss and accuracy on the whole training set")
    m = p.add_argument_group("model")
    m.add_argument("--model", choices=MODELS, default="mlp",
                   help="mlp (any input), cnn (images), resnet20 (CIFAR-shaped images)")
    m.add_argument("--hidden", type=positive_int, nargs="+", default=[128], help="MLP hidden widths")
    m.add_argument("--width", type=positive_int, default=None,
                   help="channels of the first conv layer (cnn 32, resnet20 16)")
    m.add_argument("--norm", choices=NORMS, default=None,
                   help="normalization layers (default: cnn none, resnet20 batch)")
    m.add_argument("--gossip-buffers", action="store_true",
                   help="gossip float buffers (BatchNorm statistics) with the parameters; by "
                        "default they stay local and the averaged model uses their node average")
    m.add_argument("--autocast", choices=("none", "bf16", "fp16"), default="none",
                   help="mixed precision: each node's forward and backward under torch.autocast "
                        "in bf16 or fp16 (fp16 with a dynamic loss scale) while the model x "
                        "(the float32 master weights the compressor sends) and the optimizer "
                        "state stay float32 (needs --dtype float32); pair it with --compressor "
                        "bf16 to send half the bits. docs/low-precision.md")
    m.add_argument("--quantize", choices=("none", "int8", "int8-sr"), default="none",
                   help="8-bit compute (Aketi, Kodge & Roy 2022): each node's linear and conv "
                        "layers round their weights, input activations and output gradients to "
                        "256 min-max levels (int8-sr: activations and gradients by stochastic "
                        "rounding, seeded per node) while x and the optimizer state stay float32; "
                        "not with --autocast. Pair it with --compressor lead:7 for 8-bit "
                        "messages. docs/low-precision.md")
    m.add_argument("--master-weights", action=argparse.BooleanOptionalAction, default=None,
                   help="with --dtype bfloat16/float16 (models stored, sent and mixed in 16 "
                        "bits): each node's optimizer steps a float32 copy of its parameters, "
                        "the model following it rounded (default: on with a local optimizer; "
                        "--no-master-weights steps the half parameters)")
    a = p.add_argument_group("algorithm")
    a.add_argument("--algorithm", default="dpsgd",
                   help=f"{', '.join(optimizer_algorithms)} (local optimizer step), or "
                        f"{', '.join(sorted(set(trainable_algorithms) - set(optimizer_algorithms)))} "
                        "(plain gradient with step --lr; the adaptive ones keep their own Adam "
                        "state and want --lr about 1e-3; the all-reduce methods "
                        f"{', '.join(catalog.algorithms(lambda t: t.complete))} "
                        "need --topology complete; the asynchronous "
                        f"{', '.join(catalog.algorithms(lambda t: t.trains and t.asynchronous))} "
                        "run in virtual time, a round being a sweep of n activations), or "
                        "module:Class")
    a.add_argument("--compressor", default="none",
                   help=f"compressor spec: {catalog.compressor_usage()} (powergossip: none, it sketches "
                        "by itself)")
    a.add_argument("--flat-compression", action="store_true",
                   help="compress the whole flat model at once instead of tensor by tensor")
    a.add_argument("--gamma", type=gamma_value, default=None,
                   help=f"consensus step, or 'auto' ({', '.join(tunable)}): a short search over "
                        "--gamma-grid, each candidate on a fresh run of --tune-fraction of the "
                        "rounds with the same seed; the lowest final training loss of the "
                        "averaged model among those that did not diverge wins (default: the "
                        "algorithm's own)")
    a.add_argument("--gamma-grid", type=positive_float, nargs="+", default=None,
                   help="candidates of --gamma auto (default 1 0.5 0.2 0.1 0.05 0.02 0.01)")
    a.add_argument("--tune-fraction", type=positive_float, default=0.1,
                   help="share of the run's rounds each --gamma auto candidate runs")
    a.add_argument("--rank", type=positive_int, default=None, help="PowerGossip's rank (default 1)")
    a.add_argument("--power-iterations", type=positive_int, default=None,
                   help="PowerGossip's power steps per round (default 1)")
    add_hparam_argument(a, "--hparam freeze_step=100 eps=1e-4 (onebit-adam), --hparam byzantine=1,5 "
                           "(signum)")
    a.add_argument("--alpha", type=float, default=None, help="LEAD's state momentum α")
    a.add_argument("--gamma-dual", type=float, default=None, help="LEAD's dual step γ_dual")
    o = p.add_argument_group("local optimizer")
    o.add_argument("--optimizer", choices=OPTIMIZERS, default=None,
                   help=f"{', '.join(OPTIMIZERS)} (default momentum, sgd for the federated "
                        f"clients' local steps; algorithms other than "
                        f"{', '.join(optimizer_algorithms)} take the plain gradient: sgd only)")
    o.add_argument("--lr", type=positive_float, default=0.1,
                   help="learning rate (the step eta of algorithms without a local optimizer)")
    o.add_argument("--momentum", type=non_negative_float, default=0.9, help="momentum of momentum/nesterov")
    o.add_argument("--weight-decay", type=non_negative_float, default=0.0,
                   help="weight decay (an L2 term of the gradient for algorithms without a local "
                        "optimizer)")
    o.add_argument("--no-decay-1d", action="store_true",
                   help="no weight decay on tensors with ndim <= 1 (biases, norm weights)")
    s = p.add_argument_group("learning-rate schedule (counted in epochs, applied per round)")
    s.add_argument("--schedule", choices=SCHEDULES, default="constant",
                   help="after warm-up: constant, step (x --lr-decay at each milestone), cosine")
    s.add_argument("--warmup-epochs", type=non_negative_float, default=0.0, help="linear warm-up length")
    s.add_argument("--warmup-start", type=non_negative_float, default=0.1,
                   help="learning-rate multiplier at the start of the warm-up")
    s.add_argument("--milestones", type=non_negative_float, nargs="*", default=[],
                   help="epochs at which the step schedule multiplies the rate by --lr-decay")
    s.add_argument("--lr-decay", type=positive_float, default=0.1, help="factor of the step schedule")
    s.add_argument("--min-lr-factor", type=non_negative_float, default=0.0,
                   help="final multiplier of the cosine schedule")
    r = p.add_argument_group("length and evaluation")
    r.add_argument("--epochs", type=positive_float, default=20.0,
                   help="training length in epochs (a fraction allowed): an epoch is one pass over "
                        "each node's data, ceil(N_train / (nodes × batch size)) rounds, as every "
                        "node draws one mini-batch a round (a federated round draws clients per "
                        "round × local steps of them)")
    add_rounds_argument(r, None, note="overrides --epochs (default: --epochs × the rounds of an "
                                      "epoch)")
    r.add_argument("--eval-every", type=positive_float, default=1.0,
                   help="evaluate and log every this many epochs (--log-every K rounds overrides)")
    r.add_argument("--target", type=positive_float, default=None, metavar="ACCURACY",
                   help="test accuracy (e.g. 0.9) counted as reached: the table adds the rounds "
                        "and, for timed runs, the virtual and wall seconds to reach it")
    add_federated_arguments(p)
    fed = next(g for g in p._action_groups if g.title and g.title.startswith("federated"))
    fed.add_argument("--local-epochs", type=positive_float, default=None, metavar="E",
                     help="E passes over its data per round for each client instead of "
                          "--local-steps: client i takes ceil(E * n_i / --batch-size) steps "
                          "(McMahan et al.'s u_i)")
    add_run_arguments(p)
    add_overlap_argument(p)
    add_list_argument(p, algorithms=lambda: catalog.algorithms(lambda t: t.trains))
    p.set_defaults(log_every=None, topology=None)  # ring, or star for a federated algorithm
    for action in p._actions:
        if action.dest == "log_every":
            action.help = "log every K rounds (default: every --eval-every epochs)"
    from gossip.config import parse_args_with_config

    return parse_args_with_config(p, argv)


# -- building blocks -----------------------------------------------------------------------------


def load_data(args: argparse.Namespace) -> tuple[Any, Any]:
    from gossip.rng import split_seed
    from gossip.training import load_dataset

    image = args.model in ("cnn", "resnet20")
    return load_dataset(
        args.data, test_fraction=args.test_fraction, seed=split_seed(args.seed), image=image,
        **({"samples": args.synthetic_samples, "features": args.synthetic_features,
            "classes": args.synthetic_classes, "separation": args.synthetic_separation}
           if args.data == "synthetic" else {}),
    )


def build_model(args: argparse.Namespace, shape: tuple[int, ...], classes: int) -> torch.nn.Module:
    """The initial model, drawn from the run seed: identical on every process."""
    import torch

    from gossip.rng import model_seed
    from gossip.training import make_model

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(model_seed(args.seed))
        return make_model(args.model, shape, classes, hidden=args.hidden, width=args.width,
                          norm=args.norm)


def algorithm_hparams(args: argparse.Namespace, gamma: float | None, total_rounds: int,
                      rpe: int) -> dict[str, Any]:
    """Keyword hyper-parameters of the algorithm from the flags (only those it accepts)."""
    from gossip.algorithms import accepted_hparams, algorithm_class

    name = args.algorithm
    cls = algorithm_class(name)
    accepted = accepted_hparams(cls)
    hp: dict[str, Any] = {}
    if not cls.takes_optimizer and "eta" in accepted:
        hp["eta"] = args.lr
        if cls.step_schedule and _scheduled(args):
            mult = multiplier(args, total_rounds, rpe)
            hp["eta"] = lambda t, lr=args.lr: lr * mult(t - 1)
    for key, value in (("gamma", gamma), ("rank", args.rank), ("alpha", args.alpha),
                       ("gamma_dual", args.gamma_dual), ("iterations", args.power_iterations)):
        if value is not None:
            if key not in accepted:
                raise SystemExit(f"--{key.replace('_', '-')} does not apply to {name}")
            hp[key] = value
    hp.update(federated_hparams(args, accepted, name))
    extra = parse_hparams(args.hparam)
    check_hparam_types(name, {k: v for k, v in extra.items() if k in accepted})
    hp.update(extra)
    return hp


def _scheduled(args: argparse.Namespace) -> bool:
    return args.schedule != "constant" or args.warmup_epochs > 0


def multiplier(args: argparse.Namespace, total_rounds: int, rpe: int):
    from gossip.training import lr_multiplier

    return lr_multiplier(
        rounds_per_epoch=rpe, total_rounds=total_rounds, schedule=args.schedule,
        warmup_epochs=args.warmup_epochs, warmup_start=args.warmup_start,
        milestones=args.milestones, decay=args.lr_decay, min_factor=args.min_lr_factor,
    )


def check_optimizer(args: argparse.Namespace) -> str | None:
    """The optimizer name for a local-step algorithm; None for gradient algorithms."""
    from gossip.algorithms import algorithm_class
    from gossip.training import optimizer_algorithms

    cls = algorithm_class(args.algorithm)
    if cls.takes_optimizer:  # federated clients: plain SGD local steps unless asked otherwise
        return args.optimizer or ("sgd" if cls.federated else "momentum")
    if args.optimizer not in (None, "sgd"):
        raise SystemExit(
            f"{args.algorithm} takes the plain gradient with step --lr (its update needs the raw "
            f"gradient); --optimizer {args.optimizer} applies to {', '.join(optimizer_algorithms())}"
        )
    if not cls.step_schedule and _scheduled(args):
        raise SystemExit(f"{args.algorithm} runs with a constant step: use --schedule constant "
                         "and no warm-up")
    return None


def build_trainer(args, model, train_set, test_set, topology, world, gamma, total_rounds, rpe,
                  *, evaluate: bool = True, free: bool = True) -> DecentralizedTrainer:
    """The run's trainer from the flags; ``evaluate=False, free=False``: a --gamma auto trial
    (no test set, in this process and in virtual time even when the run is --free-run)."""
    import torch

    from gossip.algorithms import make_algorithm
    from gossip.training import DecentralizedTrainer, make_optimizer

    name = args.algorithm
    hp = algorithm_hparams(args, gamma, total_rounds, rpe)
    if (hp.get("sampling") == "weighted" or hp.get("aggregation") == "data") \
            and hp.get("client_weights") is None:  # by the clients' data sizes
        from gossip.rng import partition_seed
        from gossip.training.data import partition_indices

        parts = partition_indices(train_set, topology.n - 1, args.partition,
                                  partition_seed(args.seed))  # the trainer's split of the clients
        hp["client_weights"] = [float(p.size) for p in parts]
    algorithm = make_algorithm(name, **hp)
    opt_name = check_optimizer(args)
    optimizer = scheduler = None
    if opt_name is not None:
        def optimizer(params):
            return make_optimizer(opt_name, params, args.lr, momentum=args.momentum,
                                  weight_decay=args.weight_decay, decay_1d=not args.no_decay_1d)
        if _scheduled(args):
            def scheduler(opt):
                return torch.optim.lr_scheduler.LambdaLR(opt, multiplier(args, total_rounds, rpe))
    return DecentralizedTrainer(
        model, train_set, topology=topology, algorithm=algorithm, compressor=args.compressor,
        optimizer=optimizer, scheduler=scheduler,
        partition=args.partition, batch_size=args.batch_size,
        test_set=test_set if evaluate else None, gossip_buffers=args.gossip_buffers,
        per_tensor=not args.flat_compression,
        l2=args.weight_decay if opt_name is None else 0.0, seed=args.seed, world=world,
        device=args.device, dtype=torch_dtype(args.dtype), timeout=args.timeout,
        network=args.network, link_latency=args.link_latency, overlap=args.overlap,
        eval_batch_size=args.eval_batch_size, node_eval_samples=args.node_eval_samples,
        eval_train=args.eval_train and evaluate,
        autocast=None if args.autocast == "none" else args.autocast,
        master_weights=args.master_weights,
        quantize=None if args.quantize == "none" else args.quantize,
        free_run=args.free_run if free else None,
    )


def tune_gamma(args, model, train_set, topology, total_rounds, rpe):
    """--gamma auto: the documented search of gossip.tuning, every candidate in this process.

    Under mpiexec every rank runs the same in-process search (all nodes in each process): the
    pick is then identical on every rank and equal to the in-process run's, with no message.
    """
    from gossip.algorithms import algorithm_class
    from gossip.comm.world import World
    from gossip.tuning import search_gamma, tunable_algorithms

    if "gamma" not in algorithm_class(args.algorithm).tunable:
        raise SystemExit(f"--gamma auto tunes the algorithms with a tunable gamma "
                         f"({', '.join(tunable_algorithms())}); give {args.algorithm} a number (or "
                         "leave its default)")
    if not 0 < args.tune_fraction <= 1:
        raise SystemExit(f"--tune-fraction must be in (0, 1], got {args.tune_fraction}")
    rounds = max(1, math.ceil(args.tune_fraction * total_rounds))

    def trial(gamma: float) -> float:
        trainer = build_trainer(args, model, train_set, None, topology, World(None), gamma,
                                total_rounds, rpe, evaluate=False, free=False)
        trainer.fit(rounds=rounds, log_every=rounds)
        return trainer.global_train_loss()

    return search_gamma(trial, args.gamma_grid, rounds=rounds,
                        score_name="train loss of the averaged model")


MEMORY_FLAGS = "--nodes, --hidden or --width"


def unused_model_flags(args: argparse.Namespace) -> list[str]:
    """The model flags given that the chosen --model does not read: --width and --norm shape
    the conv nets only, --hidden the MLP only (each would otherwise be dropped silently)."""
    if args.model == "mlp":
        return [f for f, v in (("--width", args.width), ("--norm", args.norm)) if v is not None]
    return ["--hidden"] if list(args.hidden) != [128] else []


def model_numel(args: argparse.Namespace, shape: tuple[int, ...], classes: int) -> int:
    """Entries of the model's parameters and buffers, counted on torch's meta device: the
    model is described, not allocated (a --hidden of 10^9 costs nothing here)."""
    import torch

    from gossip.training import make_model

    with torch.device("meta"):
        model = make_model(args.model, shape, classes, hidden=args.hidden, width=args.width,
                           norm=args.norm)
    return sum(p.numel() for p in model.parameters()) + sum(b.numel() for b in model.buffers())


def check_model_memory(args: argparse.Namespace, world: Any, topology: Any, numel: int) -> None:
    """Refuse, before the model or the nodes' copies are made, a run whose models (``numel``
    entries each, :func:`model_numel`), algorithm state and optimizer state exceed the memory
    this process may use."""
    from gossip import memory
    from gossip.algorithms import form_class

    slots = {"adam": 2, "adamw": 2, "momentum": 1, "nesterov": 1}.get(args.optimizer or "momentum", 0)
    local = memory.local_share(topology.n, world.size)
    itemsize = {"float64": 8, "float32": 4}.get(args.dtype, 2)
    check_memory(args, world, numel=numel,
                 algorithms=[form_class(args.algorithm, parse_hparams(args.hparam))],
                 compressors=[args.compressor], topology=topology,
                 lower=MEMORY_FLAGS,
                 extra={"optimizer state": float(local) * numel * itemsize * slots,
                        "node modules": float(local) * numel * itemsize})


def local_epoch_steps(args: argparse.Namespace, train_set: Any, n: int) -> list[int]:
    """--local-epochs E as one K per client: ``⌈E·n_i/B⌉`` over the trainer's split of the data
    among the n − 1 clients."""
    from gossip.algorithms import accepted_hparams
    from gossip.rng import partition_seed
    from gossip.training.data import partition_indices

    if "local_steps" not in accepted_hparams(args.algorithm):
        raise SystemExit(f"error: --local-epochs does not apply to {args.algorithm} (the federated "
                         "methods with local steps take it: fedavg, fedprox, fedadam, ...)")
    if args.local_steps is not None:
        raise SystemExit("error: give --local-steps K or --local-epochs E, not both")
    parts = partition_indices(train_set, n - 1, args.partition, partition_seed(args.seed))
    return [max(1, math.ceil(args.local_epochs * p.size / args.batch_size)) for p in parts]


# -- main ------------------------------------------------------------------------------------------


def check(argv: list[str] | None = None) -> None:
    """Parse and build the run ``argv`` asks for (data, model, trainer, engine), then stop
    (compare.py's check of a sweep entry before any entry runs; ``--gamma auto`` is checked
    with the algorithm's default); a run that cannot start raises ``SystemExit``."""
    main(argv, check_only=True)


def main(argv: list[str] | None = None, check_only: bool = False) -> dict[str, Any]:
    args = parse_args(argv)
    from gossip.algorithms import accepted_hparams, algorithm_class, make_algorithm
    from gossip.errors import ConfigError, TuningError
    from gossip.metrics import JsonlLogger, versions
    from gossip.runner import execute
    from gossip.training import batches_per_round, epoch_rounds
    from gossip.training.datasets import input_shape, num_classes

    federated = algorithm_class(args.algorithm).federated
    if args.topology is None:
        args.topology = "star" if federated else "ring"
    def nodes_memory(world: Any) -> None:  # before the graph: its nodes alone, the model unknown
        check_memory(args, world, numel=1, algorithms=[algorithm_class(args.algorithm)],
                     compressors=[args.compressor], lower=MEMORY_FLAGS, nodes=args.nodes)

    world, topology = setup(args, before_topology=nodes_memory)
    check_asynchronous(args, args.algorithm)
    try:
        train_set, test_set = load_data(args)
        shape, classes = input_shape(train_set), num_classes(train_set, test_set)
        unused = unused_model_flags(args)
        if unused and world.is_root:
            log.warning("--model %s does not use %s; %s no effect on this run", args.model,
                        " or ".join(unused), "it has" if len(unused) == 1 else "they have")
        check_model_memory(args, world, topology, model_numel(args, shape, classes))
        model = build_model(args, shape, classes)
        if args.local_epochs is not None:
            args.local_steps = local_epoch_steps(args, train_set, topology.n)
        per_round = topology.n
        if federated:  # the batches a round draws: clients per round × local steps
            probe = make_algorithm(args.algorithm, **federated_hparams(
                args, accepted_hparams(args.algorithm), args.algorithm))
            per_round = batches_per_round(probe, topology.n)
        rpe = epoch_rounds(len(train_set), per_round, args.batch_size)
        total = args.rounds if args.rounds is not None else max(1, math.ceil(args.epochs * rpe))
        log_every = args.log_every or max(1, round(args.eval_every * rpe))
        search = None
        gamma = args.gamma
        if gamma == "auto" and check_only:
            gamma = None
        if gamma == "auto":
            search = tune_gamma(args, model, train_set, topology, total, rpe)
            gamma = search.pick
            if world.is_root:
                print(search.describe(), flush=True)
        trainer = build_trainer(args, model, train_set, test_set, topology, world, gamma, total,
                                rpe)
    except (ConfigError, TuningError, ValueError) as exc:
        raise SystemExit(f"error: {exc}") from None
    if check_only:
        return {}

    # all-reduce methods compress inside their collective: name their codec, not --compressor
    wire = getattr(trainer.engine.algorithm, "codec", None) or args.compressor
    label = run_label(args.algorithm, wire, parse_hparams(args.hparam), sep=" ") + (
        f" γ={gamma:g}" if gamma is not None else "") + (
        f" autocast={args.autocast}" if args.autocast != "none" else "") + (
        f" quantize={args.quantize}" if args.quantize != "none" else "") + (
        f" {args.dtype}" if args.dtype != "float32" else "") + (
        " no-master" if args.master_weights is False else "")
    logger = JsonlLogger(args.out, enabled=world.is_root)
    config = {
        "script": "train", "args": vars(args), "algorithm": args.algorithm,
        "hparams": trainer.engine.hparams, "compressor": args.compressor,
        "nodes": topology.n, "world_size": world.size, "topology": topology_record(topology),
        "model": args.model, "parameters": sum(p.numel() for p in model.parameters()),
        "flat_numel": trainer.layout.numel, "train_samples": len(train_set),
        "test_samples": len(test_set), "classes": classes,
        "partition_sizes": [int(p.size) for p in trainer.partition],
        "rounds_per_epoch": rpe, "log_every": log_every,
        "gamma_search": search.record() if search else None, "versions": versions(),
    }
    free_async = args.free_run is not None and algorithm_class(args.algorithm).asynchronous
    result = execute(trainer.engine, label=label, config=config, logger=logger, rounds=total,
                     log_every=log_every, metrics=[trainer.metrics], progress=args.progress,
                     node_metrics=[trainer.node_metrics] if free_async else (),
                     not_extendable=("its learning-rate schedule spans the run's length; run the "
                                     "longer run from the start with a new --checkpoint-dir")
                     if _scheduled(args) else None,
                     **checkpoint_options(args, 0))
    logger.close()
    records, summary = result.records, dict(result.summary)
    epochs = trainer.engine.round / rpe
    summary["epochs"] = epochs
    summary["seconds_per_epoch"] = summary["wall_time_s"] / epochs if epochs else float("nan")
    row = table_row(label, records, summary, args.target)
    if world.is_root:
        print(format_table([row]))
        if args.plot:
            plot(args.plot, label, records, topology)
    return row


def table_row(label: str, records: list[dict], summary: dict,
              target: float | None = None) -> dict[str, Any]:
    """The run's table row from its records and summary. A federated run (its records count
    ``bits_up_per_client`` / ``bits_down_per_client`` from the bytes sent each way) keeps both
    directions; with a ``target`` test accuracy, the round and the virtual and wall seconds
    (the records' clocks, :data:`gossip.outputs.CLOCKS`) at which the run first reached it."""
    from gossip.outputs import CLOCKS, first_reached

    last = records[-1] if records else {}
    row = {"run": label, "epochs": summary["epochs"], "rounds": last.get("round"),
           "train_loss": last.get("train_loss"),
           "test_loss": last.get("test_loss"), "test_accuracy": last.get("test_accuracy"),
           "worst_node_accuracy": last.get("worst_node_accuracy"),
           "consensus_error": last.get("consensus_error"),
           "bits_per_node": last.get("bits_per_node"),
           "seconds_per_epoch": summary["seconds_per_epoch"],
           "seconds_per_round": summary.get("seconds_per_round"), "status": summary["status"],
           **({"time_virtual_s": last["time_virtual_s"]} if "time_virtual_s" in last else {}),
           **({"wall_s": last["wall_s"]} if "wall_s" in last else {})}
    if "bits_up_per_client" in last:
        row["bits_up_per_client"] = last["bits_up_per_client"]
        row["bits_down_per_client"] = last["bits_down_per_client"]
    if target is not None:
        hit = first_reached(records, "test_accuracy", target, higher=True)
        row["target"] = {"accuracy": target, "reached": hit is not None,
                         "round": hit["round"] if hit else None,
                         **{key: (hit or {}).get(key) for key, _ in CLOCKS}}
    return row


def format_table(rows: list[dict]) -> str:
    """The runs' markdown table. Federated runs (every row) count rounds, not epochs (a round
    is one exchange with the sampled clients, however many local steps it holds), and show the
    bits each client sent up and received down; timed runs add their final virtual time, free
    runs their wall time, and with a target accuracy the rounds and seconds to reach it."""
    from gossip.outputs import CLOCKS, to_target_cell

    def f(v: Any, spec: str) -> str:
        return "—" if v is None else format(v, spec)

    federated = bool(rows) and all("bits_up_per_client" in r for r in rows)
    virtual = any("time_virtual_s" in r for r in rows)  # asynchronous runs: their virtual time
    wall = any("wall_s" in r for r in rows)  # --free-run: the wall seconds paced by the draws
    goal = next((r["target"]["accuracy"] for r in rows if "target" in r), None)
    clocks = [(key, head) for key, head in CLOCKS if any(key in r for r in rows)]
    head = ["run", "rounds" if federated else "epochs", "train loss", "test loss", "test acc",
            "worst node acc", "consensus error",
            *(["bits up/client", "bits down/client"] if federated else ["bits/node"]),
            "s/round" if federated else "s/epoch", *(["virtual s"] if virtual else []),
            *(["wall s"] if wall else []),
            *([f"rounds to {goal:.4g}", *(f"{h} to {goal:.4g}" for _, h in clocks)]
              if goal is not None else []), "status"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [r["run"], f(r["rounds"], "d") if federated else f(r["epochs"], ".3g"),
                 f(r["train_loss"], ".4f"), f(r["test_loss"], ".4f"), f(r["test_accuracy"], ".2%"),
                 f(r["worst_node_accuracy"], ".2%"), f(r["consensus_error"], ".3g")]
        cells += ([f(r["bits_up_per_client"], ".3g"), f(r["bits_down_per_client"], ".3g"),
                   f(r["seconds_per_round"], ".3f")] if federated else
                  [f(r["bits_per_node"], ".3g"), f(r["seconds_per_epoch"], ".3f")])
        cells += [f(r.get("time_virtual_s"), ".4g")] if virtual else []
        cells += [f(r.get("wall_s"), ".4g")] if wall else []
        if goal is not None:
            hit = r.get("target", {})
            hit = hit if hit.get("reached") else None
            cells += [to_target_cell(hit, "round", "d"),
                      *(to_target_cell(hit, key) for key, _ in clocks)]
        lines.append("| " + " | ".join(cells + [str(r["status"])]) + " |")
    return "\n".join(lines)


def plot(path: str, label: str, records: list[dict], topology: Any) -> None:
    from gossip.plot import plot_runs

    title = f"{label} on {topology.name}, n={topology.n}"
    out = plot_runs({label: records}, path, metric="test_accuracy", logy=False, title=title,
                    flag="--plot")
    loss = Path(path).with_name(Path(path).stem + "-loss" + (Path(path).suffix or ".png"))
    plot_runs({label: records}, loss, metric="train_loss", title=title, flag="--plot")
    log.info("plots written to %s and %s", out, loss)


if __name__ == "__main__":
    guarded(lambda: exit_status(main()))
