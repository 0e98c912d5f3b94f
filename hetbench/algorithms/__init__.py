"""The synchronization algorithms, one module (or small package) each: its options, its pure
decision rules, its real step on Comm and its simulated protocol. They are registered by module
path in hetbench.core.registry.ALGORITHMS."""
