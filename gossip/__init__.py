"""gossip: decentralized learning with compressed communication over arbitrary graphs."""

__version__ = "0.1.0"
