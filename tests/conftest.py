"""Pytest setup for every test: one torch thread. Shared helpers live in tests/helpers/."""

from __future__ import annotations

import torch

torch.set_num_threads(1)
