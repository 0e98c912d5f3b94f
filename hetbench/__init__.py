"""hetbench: benchmark distributed-training synchronization algorithms under slow workers."""

__version__ = "0.1.0"
