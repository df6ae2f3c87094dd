"""Prox-LEAD (Li et al. 2021; docs/algorithms/prox-lead.md): LEAD for ``(1/n) Σ f_i + r`` with a prox.

Identical to :class:`LEAD` (same message ``C(y − h)``) except that every primal update ends
with the local prox: ``x_i ← prox_{ηr}(x_i − η g − η d_i)``, including the first step
``x_i ← prox_{ηr}(x_i⁰ − η g⁰)``. The gradient estimator (full, SGD, LSVRG, SAGA) lives in
the node's oracle; with ``r = 0`` this is LEAD.

With LEAD's ``arcs`` option (``prox-lead-arcs``) the state is kept per arc, as LEAD's
(:mod:`gossip.algorithms.lead`): robust to lost messages.
"""

from __future__ import annotations

from gossip.algorithms.lead import LEAD
from gossip.core.block import Block
from gossip.errors import ConfigError


class ProxLEAD(LEAD):
    """Prox-LEAD: :class:`LEAD` whose primal updates end with ``prox_{ηr}`` of the problem's
    regularizer, for ``(1/n) Σ f_i + r``. See docs/algorithms/prox-lead.md. With LEAD's
    ``arcs`` option (``prox-lead-arcs``) its dual sum ``Σ_i d_i = 0`` is kept under any loss;
    the prox acts on x only, after the dual step, so the fixed point is Prox-LEAD's whatever was
    lost (docs/algorithms/prox-lead-arcs.md).

    Args:
        eta, alpha, gamma_dual: as for :class:`LEAD`.
    """
    name = "prox-lead"
    state_copies = 12
    arcs_form = LEAD.arcs_form

    def validate_block(self, block: Block) -> None:
        if not all(getattr(nd.oracle, "has_prox", False) for nd in block.nodes):
            raise ConfigError(
                "prox-lead needs a problem with a regularizer (e.g. lasso, l1-logistic); "
                "use lead for smooth problems"
            )

    def finish(self, block: Block) -> None:
        for r in block.computing_rows():  # not a node inactive this round (--network active=)
            xr = block.x[r]
            block.nodes[r].oracle.prox(xr, self.eta, out=xr)

