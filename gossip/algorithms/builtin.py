"""The built-in algorithms, registered under their names in :data:`gossip.core.registry.ALGORITHMS`
(importing :mod:`gossip.algorithms` imports this module)."""

from __future__ import annotations

from gossip.algorithms.accum_adam import AccumAdam, AccumAdamW
from gossip.algorithms.ad_psgd import ADPSGD
from gossip.algorithms.adaptive_gossip import DADAM, DESLOC, ChocoAMSGrad, TrackedAMSGrad
from gossip.algorithms.adasum import Adasum
from gossip.algorithms.admm import ADMM, DLM
from gossip.algorithms.atc import ATCDGD, NEXT, ATCDIGing
from gossip.algorithms.beer import BEER
from gossip.algorithms.cada import CADA, GCADA
from gossip.algorithms.choco import Choco
from gossip.algorithms.choco_async import AsyncChoco
from gossip.algorithms.dcd import DCD
from gossip.algorithms.deepsqueeze import DeepSqueeze
from gossip.algorithms.diffusion import LED, ExactDiffusion
from gossip.algorithms.directed import CPP, PushSum
from gossip.algorithms.dpsgd import DPSGD
from gossip.algorithms.ecd import ECD
from gossip.algorithms.ecl import CECL
from gossip.algorithms.feddyn import FedDyn
from gossip.algorithms.federated import FedAdagrad, FedAdam, FedAvg, FedProx, FedYogi, Scaffold
from gossip.algorithms.federated_adam import FedAdamSSM, FedAdamW
from gossip.algorithms.fednova import FedNova
from gossip.algorithms.gossip import Gossip
from gossip.algorithms.gossip_learning import GossipLearning
from gossip.algorithms.greedylore import GreedyLore, PowerSGD
from gossip.algorithms.gt_vr import GTSAGA, GTSARAH
from gossip.algorithms.lead import LEAD
from gossip.algorithms.local_tracking import KGT, Scaffnew
from gossip.algorithms.lodadac import LoDAdaC
from gossip.algorithms.momentum import DoCoM, MoTEF
from gossip.algorithms.onebit_adam import APMSqueeze, OneBitAdam
from gossip.algorithms.onebit_lamb import OneBitLamb
from gossip.algorithms.pairwise import PairwiseGossip
from gossip.algorithms.powergossip import PowerGossip
from gossip.algorithms.prox_lead import ProxLEAD
from gossip.algorithms.robust_push_sgd import RobustPushSGD
from gossip.algorithms.running_sum import RobustPushSum, RobustPushTracking
from gossip.algorithms.sgp_async import AsyncSGP
from gossip.algorithms.signum import SignumVote
from gossip.algorithms.squarm import SQuARM
from gossip.algorithms.tracking import CGT, EXTRA, DIGing
from gossip.algorithms.zero_one_adam import ZeroOneAdam
from gossip.core.algorithm import Algorithm
from gossip.core.registry import register_algorithm

BUILTIN: tuple[type[Algorithm], ...] = (
    Gossip, DPSGD, Choco, DeepSqueeze, DCD, ECD, LEAD, ProxLEAD, PowerGossip, BEER, DIGing, EXTRA,
    CGT, PushSum, CPP, DoCoM, MoTEF, CECL, ATCDGD, ATCDIGing, NEXT, ExactDiffusion, LED, ADMM, DLM,
    GTSAGA, GTSARAH, KGT, Scaffnew,
    OneBitAdam, APMSqueeze, ZeroOneAdam, OneBitLamb, SignumVote, Adasum, GreedyLore, PowerSGD,
    DADAM, TrackedAMSGrad, ChocoAMSGrad, DESLOC, AccumAdam, AccumAdamW, LoDAdaC, SQuARM,
    FedAvg, FedProx, FedAdam, FedYogi, FedAdagrad, Scaffold, FedAdamW, FedAdamSSM, FedDyn, FedNova,
    CADA, GCADA, PairwiseGossip, ADPSGD, GossipLearning, AsyncSGP, AsyncChoco,
    RobustPushSum, RobustPushTracking, RobustPushSGD,
)
"""Every built-in algorithm class, in the order ``--help`` lists them (a class that declares an
``arcs_form`` is followed by its robust per-arc form, ``NAME-arcs``)."""

for _cls in BUILTIN:
    register_algorithm(_cls)
