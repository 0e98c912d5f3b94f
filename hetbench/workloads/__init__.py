"""Workloads: model + dataset + loss + evaluation, one module each, registered by module path in
hetbench.core.registry.WORKLOADS."""
