"""Running sums that keep what rounding drops: compensated (Kahan) accumulation of state.

A method's dual variable or tracker is a running sum ``s ← s + α·v`` whose value stays of the
size of a gradient while its increments ``v`` shrink with the error. Once ``|α·v|`` falls below
half an ulp of ``s`` a plain ``s.add_(v, alpha=α)`` drops the increment, and the method's steady
state repeats the same increments every round, so the same roundings add up to a drift that
grows linearly: LEAD's ``Σ_i d_i = 0``, which fixes its optimum, moved by a rounding of ``‖d‖``
per round and the distance to ``x*`` crept back up as t² in float32. :class:`CompensatedSum`
keeps, per element, the part of each addition that the rounding dropped and adds it back with
the next increment (Kahan's summation), so ``s`` stays within an ulp of the exact sum of what
was added, for any number of rounds; the compensation is state (in ``block.state``), so a
resumed run continues bit for bit.
"""

from __future__ import annotations

from typing import Any

import torch


class CompensatedSum:
    """``block.state[key]`` as a compensated running sum (module docstring).

    Args:
        block: the block whose state holds the sum (``block.state[key]``, already there) and
            its compensation (``block.state[key + ".err"]``, allocated zero here if absent).
        key: the state key of the sum.
    """

    def __init__(self, block: Any, key: str):
        self.key = key
        self.sum: torch.Tensor = block.state[key]
        err = key + ".err"
        if err not in block.state:
            block.state[err] = torch.zeros_like(self.sum)
        self.err: torch.Tensor = block.state[err]
        """``e``: minus what the last additions rounded away (added to the next increment)."""
        self._y = torch.empty_like(self.sum)

    def add_(self, v: torch.Tensor, alpha: float = 1.0) -> torch.Tensor:
        """``s ← s + α·v``, compensated: ``y = α·v + e``; ``s' = fl(s + y)``; ``e = (s − s') + y``
        (exact while ``|y| ≤ |s|``, Fast2Sum). Returns ``s``."""
        s, e, y = self.sum, self.err, self._y
        torch.add(e, v, alpha=alpha, out=y)
        e.copy_(s)
        s.add_(y)
        e.sub_(s).add_(y)
        return s
