"""The cluster's network: one model (model.py) for emulated real runs (emulator.py, with the
state ranks share in shared.py) and for the simulator."""
