"""Configs, matrix expansion, launchers, the worker loop, Comm and the result store."""
