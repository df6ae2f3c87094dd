"""Decentralized algorithms, one module each, built by name from the registry."""

from __future__ import annotations

from typing import Any

from gossip.algorithms.base import Algorithm, ConfigError, Exchange, Inbox, Node
from gossip.algorithms.beer import BEER
from gossip.algorithms.choco import Choco
from gossip.algorithms.dcd import DCD
from gossip.algorithms.deepsqueeze import DeepSqueeze
from gossip.algorithms.directed import CPP, PushSum
from gossip.algorithms.dpsgd import DPSGD
from gossip.algorithms.ecd import ECD
from gossip.algorithms.ecl import CECL
from gossip.algorithms.gossip import Gossip
from gossip.algorithms.lead import LEAD
from gossip.algorithms.momentum import DoCoM, MoTEF
from gossip.algorithms.powergossip import PowerGossip
from gossip.algorithms.prox_lead import ProxLEAD
from gossip.algorithms.tracking import CGT, EXTRA, DIGing

REGISTRY: dict[str, type[Algorithm]] = {
    cls.name: cls
    for cls in (Gossip, DPSGD, Choco, DeepSqueeze, DCD, ECD, LEAD, ProxLEAD, PowerGossip, BEER,
                DIGing, EXTRA, CGT, PushSum, CPP, DoCoM, MoTEF, CECL)
}


def register(cls: type[Algorithm]) -> type[Algorithm]:
    """Add an algorithm class to the registry under ``cls.name``."""
    REGISTRY[cls.name] = cls
    return cls


def make_algorithm(name: str, **hparams: Any) -> Algorithm:
    """Build an algorithm by registry name with keyword hyper-parameters (unknown ones rejected)."""
    try:
        cls = REGISTRY[name]
    except KeyError:
        raise ConfigError(
            f"unknown algorithm '{name}'; choose one of: {', '.join(sorted(REGISTRY))}"
        ) from None
    import inspect

    accepted = set(inspect.signature(cls.__init__).parameters) - {"self"}
    unknown = set(hparams) - accepted
    if unknown:
        raise ConfigError(
            f"{name} does not take {sorted(unknown)}; its hyper-parameters are {sorted(accepted)}"
        )
    return cls(**hparams)


__all__ = ["Algorithm", "ConfigError", "Exchange", "Inbox", "Node", "REGISTRY", "make_algorithm",
           "register"]
