"""What the nodes optimize: problems, their gradient oracles, data and exact optima.

A :class:`Problem` is ``min_x (1/n) Σ_i f_i(x) + r(x)`` on a torch device; algorithms get node
``i``'s gradients through ``problem.oracle(i, generator, estimator)`` (full, sgd, lsvrg, saga) and
metrics use ``problem.objective(x)`` and ``problem.solution()``.

    >>> from gossip.problems import make_problem, default_hparams
    >>> pb = make_problem("lasso", n_nodes=8, dim=100, samples_per_node=50)
    >>> eta = default_hparams(pb)["eta"]
"""

from gossip.problems.base import Problem, Smoothness
from gossip.problems.consensus import Consensus
from gossip.problems.data import (
    SyntheticData,
    load_libsvm,
    partition,
    synthetic,
)
from gossip.problems.factory import PROBLEMS, default_hparams, make_problem, register_problem
from gossip.problems.glm import GLM, L1Logistic, Lasso, LeastSquares, Logistic
from gossip.problems.oracles import (
    ESTIMATORS,
    LSVRG,
    SAGA,
    SGD,
    FullGradient,
    FullGradientRows,
    Oracle,
    OracleFactory,
    make_oracle,
)
from gossip.problems.regularizers import L1, Regularizer

__all__ = [
    "ESTIMATORS",
    "GLM",
    "L1",
    "LSVRG",
    "PROBLEMS",
    "SAGA",
    "SGD",
    "Consensus",
    "FullGradient",
    "FullGradientRows",
    "L1Logistic",
    "Lasso",
    "LeastSquares",
    "Logistic",
    "Oracle",
    "OracleFactory",
    "Problem",
    "Regularizer",
    "Smoothness",
    "SyntheticData",
    "default_hparams",
    "load_libsvm",
    "make_oracle",
    "make_problem",
    "partition",
    "register_problem",
    "synthetic",
]
