"""Deprecated: where the fair transport lived before the emulator of real runs played it too
(now hetbench.network.transport; a protocol's `ANY` comes from hetbench.api)."""

from hetbench.core.moved import moved
from hetbench.network.transport import ANY, SOCKET_BUFFER_BYTES, Transport  # noqa: F401

moved("hetbench.sim.transport", "hetbench.api")
