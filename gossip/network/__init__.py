"""The network simulator: what messages meet between sender and receiver, how long nodes take,
and the runs that live in that time (docs/network.md, docs/asynchronous.md).

The engine talks to one object, the run's :class:`Simulator` (:func:`build`); behind it:

* :mod:`~gossip.network.spec` — the ``--network`` grammar and its models (:class:`Network`,
  :func:`parse_network`);
* :mod:`~gossip.network.draws` — keyed draws of synchronous rounds (losses, lags);
* :mod:`~gossip.network.timing` — keyed draws in virtual time (:class:`Timing`: compute times,
  delays, per-message losses, stragglers, churn);
* :mod:`~gossip.network.noise` — a noisy channel: Gaussian noise on the decoded values of
  every delivered message;
* :mod:`~gossip.network.activity` — synchronous partial activation (who takes part in a round);
* :mod:`~gossip.network.loss`, :mod:`~gossip.network.stale` — what a lost or late message of a
  round means to its receiver, per the algorithm's :attr:`~gossip.core.Algorithm.on_loss`;
* :mod:`~gossip.network.clock` — the rounds' virtual clock and their wall-clock pacing;
* :mod:`~gossip.network.events` — asynchronous runs in virtual time (the event loop);
* :mod:`~gossip.network.freerun` — asynchronous runs on wall clocks under mpiexec;
* :mod:`~gossip.network.frames` — an asynchronous message as it travels between processes;
* :mod:`~gossip.network.host` — what the network reads of the engine (a protocol: nothing here
  imports the engine);
* :mod:`~gossip.network.simulator` — :class:`Simulator` and :func:`build`.
"""

from gossip.network.activity import Activity, NodeAsleep
from gossip.network.draws import ActivityDraws, LagDraws, LossDraws, NoiseDraws, arc_keys
from gossip.network.freerun import NodeMetric
from gossip.network.simulator import Simulator, build
from gossip.network.spec import (
    DIST_FORMS,
    FORMS,
    LAG_FORMS,
    ActiveBernoulli,
    ActiveCyclic,
    ActiveMarkov,
    ActivePoisson,
    ArcLags,
    Bernoulli,
    Churn,
    Dist,
    Exponential,
    Fixed,
    FixedLag,
    GeometricLag,
    GilbertElliott,
    LogNormal,
    Network,
    Noise,
    Slow,
    Uniform,
    UniformLag,
    parse_network,
)
from gossip.network.timing import Timing

__all__ = ["Network", "parse_network", "Simulator", "build", "NodeMetric", "Timing", "Bernoulli",
           "GilbertElliott", "LossDraws", "LagDraws", "FixedLag", "GeometricLag", "UniformLag",
           "ArcLags", "LAG_FORMS", "arc_keys", "FORMS", "DIST_FORMS", "Fixed", "Exponential",
           "Uniform", "LogNormal", "Dist", "Slow", "Churn", "Noise", "NoiseDraws",
           "ActivityDraws", "Activity", "NodeAsleep", "ActiveBernoulli", "ActiveMarkov",
           "ActivePoisson", "ActiveCyclic"]
