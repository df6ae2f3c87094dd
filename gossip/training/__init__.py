"""Decentralized training of PyTorch models: your model, a ``torch.optim`` optimizer, gossip.

    import torch, topologies
    from gossip.training import DecentralizedTrainer, MLP, digits

    train, test = digits()
    trainer = DecentralizedTrainer(
        MLP(64, 10), train, test_set=test, topology=topologies.build("ring", 8),
        algorithm="choco", compressor="topk:0.01", partition="dirichlet:0.5",
        optimizer=lambda params: torch.optim.SGD(params, lr=0.1, momentum=0.9),
    )
    for epoch in range(30):
        rec = trainer.fit(epochs=1)[-1]

Modules, one job each: :mod:`~gossip.training.flat` (a module's tensors as views into one flat
buffer), :mod:`~gossip.training.data` (per-node partitions and loaders),
:mod:`~gossip.training.datasets` (digits, synthetic, files on disk),
:mod:`~gossip.training.models` (MLP, small CNN, ResNet-20), :mod:`~gossip.training.optim`
(optimizers and schedules by name), :mod:`~gossip.training.oracle` (the gradient oracle the
algorithms call), :mod:`~gossip.training.evaluate` (loss/accuracy sums) and
:mod:`~gossip.training.trainer` (all of it on an engine).
"""

from gossip.training.build import optimizer_algorithms, trainable_algorithms
from gossip.training.data import (
    BatchStream,
    labels_of,
    node_loader,
    partition_dataset,
    partition_indices,
)
from gossip.training.datasets import (
    digits,
    image_folder,
    load_dataset,
    load_tensor_file,
    synthetic_classification,
)
from gossip.training.evaluate import Sums, evaluate
from gossip.training.models import MLP, MODELS, ResNet, SmallCNN, make_model, resnet20
from gossip.training.optim import OPTIMIZERS, SCHEDULES, lr_multiplier, make_optimizer
from gossip.training.oracle import ModelOracle, OptimizerOracle
from gossip.training.trainer import DecentralizedTrainer, batches_per_round, epoch_rounds

__all__ = [
    "MLP",
    "MODELS",
    "OPTIMIZERS",
    "SCHEDULES",
    "BatchStream",
    "DecentralizedTrainer",
    "ModelOracle",
    "OptimizerOracle",
    "ResNet",
    "SmallCNN",
    "Sums",
    "digits",
    "batches_per_round",
    "epoch_rounds",
    "evaluate",
    "image_folder",
    "labels_of",
    "load_dataset",
    "load_tensor_file",
    "lr_multiplier",
    "make_model",
    "make_optimizer",
    "node_loader",
    "optimizer_algorithms",
    "partition_dataset",
    "partition_indices",
    "resnet20",
    "synthetic_classification",
    "trainable_algorithms",
]
