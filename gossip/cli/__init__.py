"""Command-line pieces every experiment script shares, one concern per module:

* :mod:`~gossip.cli.values` — flag value types (``positive_int``, ``gamma_value``, ...);
* :mod:`~gossip.cli.help` — the ``--help`` layout and ``--list [KIND]``;
* :mod:`~gossip.cli.arguments` — the shared flags (``add_run_arguments``, ``--rounds``, ...);
* :mod:`~gossip.cli.hparams` — ``--hparam`` and the federated flags as constructor keywords;
* :mod:`~gossip.cli.files` — outputs, checkpoints and ``.npy`` inputs checked before a run;
* :mod:`~gossip.cli.start` — flags to a started run: world, logging, device, topology;
* :mod:`~gossip.cli.checks` — runs refused whole (asynchronous limits, memory);
* :mod:`~gossip.cli.runs` — the runs of a multi-run script: labels, entries, verdict;
* :mod:`~gossip.cli.guard` — one ``error:`` line and an exit status for every failure.

The names the scripts use are importable from here; the rest from their module. Building a
parser imports neither torch nor networkx (``--help`` answers at once): torch, numpy, the world
and the topologies are imported by the functions that use them, after parsing. Nothing below
the scripts imports this package.
"""

from gossip.cli.arguments import (
    FEDERATED_FLAGS,
    add_federated_arguments,
    add_hparam_argument,
    add_overlap_argument,
    add_rounds_argument,
    add_run_arguments,
)
from gossip.cli.checks import check_asynchronous, check_memory
from gossip.cli.files import check_outputs, checkpoint_options, read_npy
from gossip.cli.guard import guarded
from gossip.cli.help import LIST_KINDS, HelpFormatter, add_list_argument, listing
from gossip.cli.hparams import check_hparam_types, federated_hparams, parse_hparams
from gossip.cli.runs import check_entries, exit_status, run_label, split_per_run, target_note
from gossip.cli.start import setup, topology_record
from gossip.cli.values import (
    gamma_value,
    non_negative_float,
    non_negative_int,
    positive_float,
    positive_int,
    torch_dtype,
)

__all__ = [
    "FEDERATED_FLAGS", "LIST_KINDS", "HelpFormatter", "add_federated_arguments", "add_hparam_argument",
    "add_list_argument", "add_overlap_argument", "add_rounds_argument", "add_run_arguments",
    "check_asynchronous", "check_entries", "check_hparam_types", "check_memory", "check_outputs",
    "checkpoint_options", "exit_status", "federated_hparams", "gamma_value", "guarded", "listing",
    "non_negative_float", "non_negative_int", "parse_hparams", "positive_float", "positive_int",
    "read_npy", "run_label", "setup", "split_per_run", "target_note", "topology_record",
    "torch_dtype",
]
