"""What :class:`~gossip.training.DecentralizedTrainer` and :func:`gossip.wrap` share: the
checks of a training algorithm, the engine over a module's flat model, the same-start check and
the averaged model.

Both turn one ``nn.Module`` into ``n`` nodes whose ``x`` is the module's flat vector
(:mod:`gossip.training.flat`); the oracle of each node is bound to its row of the engine's block,
so the node's module and optimizer read and write the gossiped model in place.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import torch
from torch import nn

from gossip.algorithms import REGISTRY
from gossip.comm.world import World
from gossip.compress import Compressor
from gossip.core.algorithm import Algorithm
from gossip.engine import Engine
from gossip.errors import ConfigError
from gossip.layout import Layout
from gossip.training import flat


def trainable_algorithms() -> list[str]:
    """Registered algorithms that can train a model (``trains``), sorted."""
    return sorted(name for name, cls in REGISTRY.items() if cls.trains)


def optimizer_algorithms() -> list[str]:
    """Registered algorithms whose local step goes through a ``torch.optim`` optimizer."""
    return sorted(name for name, cls in REGISTRY.items() if cls.trains and cls.takes_optimizer)


def check_trainable(alg: Algorithm, optimizer: Any, scheduler: Any = None) -> None:
    """Refuse an algorithm that cannot train, or an optimizer it would not use."""
    if not alg.trains:
        raise ConfigError(
            f"{alg.name} cannot train a model (it uses no gradients); use one of "
            f"{', '.join(trainable_algorithms())}"
        )
    if optimizer is not None and not alg.takes_optimizer:
        raise ConfigError(
            f"{alg.name} takes the gradient directly with its own step size eta (its update "
            "needs the raw gradient): pass no optimizer (set eta on the algorithm; weight "
            f"decay via l2). Local optimizers work with {', '.join(optimizer_algorithms())}"
        )
    if scheduler is not None and optimizer is None:
        raise ConfigError("a scheduler needs an optimizer to schedule")


def training_engine(algorithm: Algorithm, topology: Any, initial: torch.Tensor, layout: Layout,
                    oracles: Callable[[int, torch.Generator], Any], *, per_tensor: bool,
                    compressor: str | Compressor, seed: int, world: World | None,
                    network: Any, device: torch.device, dtype: torch.dtype,
                    fix: str, overlap: bool = False, defer_setup: bool = False,
                    free_run: float | None = None) -> Engine:
    """The engine of a training run: every node starts from ``initial``, its oracle bound to its
    row of the block (the module's parameters become views into it), and every process checked
    to start from the same model (``fix`` says how to make them equal). ``defer_setup``: the
    algorithm's setup waits for :meth:`Engine.setup` (:func:`gossip.wrap`: its first gradients
    are the user's first backward). ``free_run``: the engine's wall seconds per virtual second
    under mpiexec (:mod:`gossip.network.freerun`, :mod:`gossip.network.clock`)."""
    engine = Engine(
        algorithm, topology, lambda i: initial, compressor=compressor,
        layout=layout if (per_tensor or algorithm.needs_layout) else None,
        oracles=oracles, seed=seed, world=world, network=network,
        overlap=overlap, defer_setup=defer_setup,
        device=device, dtype=dtype, divergence_factor=float("inf"), free_run=free_run,
    )
    for node in engine.nodes.values():
        node.oracle.bind(node.x)
    check_same_start(engine, initial, fix)
    return engine


def model_hash(x: torch.Tensor) -> int:
    """A 48-bit hash of a flat model's bytes (exact in a float64, so it can be gathered)."""
    data = x.detach().to("cpu").contiguous().view(torch.uint8).numpy().tobytes()
    return int.from_bytes(hashlib.sha256(data).digest()[:6], "little")


def check_same_start(engine: Engine, initial: torch.Tensor, fix: str) -> None:
    """Every process must start from the same model (decentralized runs start equal): the hash
    of ``initial`` is compared across the nodes, and a mismatch names the ranks and ``fix``."""
    h = float(model_hash(initial))
    hashes = engine.node_values({i: h for i in engine.nodes})
    if not np.all(hashes == hashes[0]):
        placement = engine.world.placement(engine.n)
        ranks = sorted({placement[i] for i in np.flatnonzero(hashes != hashes[0]).tolist()})
        raise ConfigError(
            f"the initial model differs between processes (rank(s) {ranks} hold another model "
            f"than rank {placement[0]}, by a hash of the flat parameters); {fix}",
            rank=engine.world.rank,
        )


def load_average(engine: Engine, xbar: torch.Tensor, module: nn.Module, target: torch.Tensor,
                 node_modules: Mapping[int, nn.Module], gossip_buffers: bool) -> nn.Module:
    """Load the mean model ``xbar`` into ``module`` (bound to ``target``), with the mean of the
    nodes' float buffers when those are not gossiped (collective when there are such buffers)."""
    target.copy_(xbar)
    if not gossip_buffers and flat.float_buffers(module):
        local = {i: torch.cat([b.reshape(-1) for b in flat.float_buffers(m)])
                 for i, m in node_modules.items()}
        mean = engine.world.ordered_sum(local).div_(engine.n)
        bufs = flat.float_buffers(module)
        with torch.no_grad():
            for b, v in zip(bufs, flat.split(mean, bufs), strict=True):
                b.copy_(v)
    return module
