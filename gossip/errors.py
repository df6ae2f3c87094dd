"""The library's exceptions, in one place: what went wrong, where, and the fix.

``except gossip.GossipError`` catches a bad configuration, a malformed message, a silent
neighbor, a diverged run or an unusable checkpoint alike, while each concrete class also keeps
the builtin base it always had (``ValueError`` for bad input, ``RuntimeError`` for a run that
cannot go on, ``TypeError`` for an argument of the wrong type), so existing
``except ValueError`` code keeps working.

Every error may carry where it happened as fields set at construction (``None`` when unknown):
``round``, ``node`` (the node whose round failed, or whose data or oracle was refused),
``sender`` and ``receiver`` (of a refused message), ``rank`` (the MPI rank) and ``row`` (the
message row of a block phase). Handlers read the fields, never the text.

The tree (builtin bases in brackets)::

    GossipError
    ├── ConfigError [ValueError]          bad input, found before a run starts
    │   ├── ConfigTypeError [TypeError]   ... an argument of the wrong type
    │   ├── ConfigFileError               ... a run file (TOML) that cannot be used
    │   ├── CommConfigError               ... a communication setting (deadline, ranks)
    │   ├── PluginError                   ... a module:Name spec that cannot be imported
    │   └── WrapError                     ... what gossip.wrap cannot train (algorithm, model, launch)
    ├── CompressionError [ValueError]     bad input to a compressor, a malformed buffer
    │   ├── CompressorSpecError           ... a spec that names no compressor (a ConfigError too)
    │   └── RowsError                     ... a refused message of a block phase
    ├── ContractError [RuntimeError]      calling code broke an API contract (a bug in it)
    ├── DivergenceError [RuntimeError]    NaN/Inf or past the divergence bound
    ├── NodeError [RuntimeError]          a node's round raised
    ├── CommError [RuntimeError]          a message could not be delivered
    │   └── CommTimeout                   ... a neighbor did not answer in time
    ├── CheckpointError [RuntimeError]    a checkpoint cannot be used
    ├── OutputError [RuntimeError]        a log or plot could not be written once the run began
    ├── TuningError [RuntimeError]        no candidate of a grid gave a usable run
    ├── RunFailed [RuntimeError]          a script's run(s) did not finish (diverged, failed)
    └── Interrupted [RuntimeError]        stopped by a signal after a final checkpoint

One class per way a caller handles an error: a problem, its data, a data set or a run too
large for the memory it may use are all inputs the user chose and all raise ``ConfigError``
itself (``except ConfigError`` is the one "the inputs are wrong, nothing ran" handler a script
needs; the message names the input and the fix); a subclass exists where a caller does
something else with it: a run file (the scripts name the file), a communication setting, an
argument of the wrong type (also a ``TypeError``), a plug-in spec, and what :func:`gossip.wrap`
cannot train (the wrapper tells it from its own errors).
"""

from __future__ import annotations

import functools
import signal


class GossipError(Exception):
    """Base class of the library's own exceptions; the message says what was wrong and the fix."""

    def __init__(self, message: str = "", *, round: int | None = None, node: int | None = None,
                 sender: int | None = None, receiver: int | None = None,
                 rank: int | None = None, row: int | None = None):
        super().__init__(message)
        self.round = round
        self.node = node
        self.sender = sender
        self.receiver = receiver
        self.rank = rank
        self.row = row


# -- bad input, before a run ----------------------------------------------------------------


class ConfigError(GossipError, ValueError):
    """A run was configured with values it cannot run with (named in the message)."""


class ConfigTypeError(ConfigError, TypeError):
    """An argument of the wrong type (a tensor of the wrong dtype, an object of the wrong class)."""


class PluginError(ConfigError):
    """A ``module:Name`` spec that cannot be imported or does not name what was expected."""


class ConfigFileError(ConfigError):
    """A run file that cannot be used: unreadable, bad TOML, an unknown key or a wrong type."""


class CommConfigError(ConfigError):
    """A communication setting that cannot work (a deadline that is not a positive number, more
    MPI ranks than nodes)."""


class WrapError(ConfigError):
    """What :func:`gossip.wrap` cannot work with: an algorithm that needs gradients at points
    other than the user's model, a model or optimizer it cannot wrap, a launch whose processes
    do not match the graph; the message names the fix (often: use ``DecentralizedTrainer``)."""


# -- compression ----------------------------------------------------------------------------


class CompressionError(GossipError, ValueError):
    """Bad input to a compressor (NaN/Inf, wrong shape) or a malformed byte buffer."""


class CompressorSpecError(CompressionError, ConfigError):
    """A compressor spec that cannot be built (unknown name, bad parameters): bad input, so a
    :class:`ConfigError` as well as the :class:`CompressionError` it always was."""


class RowsError(CompressionError):
    """A message of a block phase was refused; ``sender`` and ``receiver`` name the nodes."""


# -- a run that cannot go on ----------------------------------------------------------------


class ContractError(GossipError, RuntimeError):
    """Code calling the library broke a documented contract of an API (for example a block
    encoder that did not pre-draw the random values its single-tensor path asks for): a bug in
    that code, usually an extension's compressor or algorithm, not in the run's inputs."""


class DivergenceError(GossipError, RuntimeError):
    """A run blew up: NaN/Inf in a node's state, or an error past the divergence bound."""


class NodeError(GossipError, RuntimeError):
    """A node's round raised; the message names the node, its rank and the round."""


class CommError(GossipError, RuntimeError):
    """A message could not be delivered (timeout, oversize message, dead peer)."""


class CommTimeout(CommError):
    """A neighbor did not answer before the deadline; ``rank`` is the rank that waited."""


class CheckpointError(GossipError, RuntimeError):
    """A checkpoint cannot be used (corrupt, incomplete, or made by a different run)."""


class OutputError(GossipError, RuntimeError):
    """The ``--out`` log or the ``--plot`` image could not be written after the run began (disk
    full, a file-size limit): the paths were checked before the run, so this is a failed run
    (exit status 1), not bad input; the records written before are kept whole."""


class TuningError(GossipError, RuntimeError):
    """No candidate of the grid gave a usable run."""


class RunFailed(GossipError, RuntimeError):
    """A script ran, but some of its runs did not finish (diverged or failed); the table has
    been printed. The command-line tools exit with status 1."""


class Interrupted(GossipError, RuntimeError):
    """The run stopped on SIGINT/SIGTERM after writing a final checkpoint of ``round``.

    Not a failure: the command-line tools exit with ``128 + signum`` (the shell's convention).
    """

    def __init__(self, signum: int, *, round: int | None = None, rank: int | None = None):
        super().__init__(f"stopped by signal {signal.Signals(signum).name} at round {round}; "
                         "a checkpoint of this round was written (resume with --resume DIR)",
                         round=round, rank=rank)
        self.signum = int(signum)

    def __reduce__(self):  # rebuilt from the signal and the round, not from the message
        return functools.partial(type(self), round=self.round, rank=self.rank), (self.signum,), self.__dict__


__all__ = [
    "CheckpointError",
    "CommConfigError",
    "CommError",
    "CommTimeout",
    "CompressionError",
    "CompressorSpecError",
    "ConfigError",
    "ConfigFileError",
    "ConfigTypeError",
    "ContractError",
    "DivergenceError",
    "GossipError",
    "Interrupted",
    "NodeError",
    "OutputError",
    "PluginError",
    "RowsError",
    "RunFailed",
    "TuningError",
    "WrapError",
]
