"""Examples of user code that extends gossip from outside the package (docs/extending.md)."""
