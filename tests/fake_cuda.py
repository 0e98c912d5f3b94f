"""A fake CUDA stream and events, for tests of device timing on a machine without a GPU. Like
a GPU, the stream accepts work at once ("launches") and finishes it later; an event happens
when the stream reaches it; synchronize() blocks until the work (or the event) is done. The
`fake_cuda` fixture (tests/unit/conftest.py) puts them in torch.cuda's place."""

import time


class FakeStream:
    def __init__(self):
        self.busy_until = 0.0
        self.syncs = 0

    def launch(self, seconds: float) -> None:
        self.busy_until = max(self.busy_until, time.monotonic()) + seconds

    def synchronize(self) -> None:
        self.syncs += 1
        time.sleep(max(0.0, self.busy_until - time.monotonic()))


class FakeEvent:
    """Happens when the stream it was recorded on reaches it (monotonic seconds)."""

    waits = 0

    def __init__(self, enable_timing=False):
        self.at = None

    def record(self, stream):
        self.at = max(stream.busy_until, time.monotonic())

    def query(self) -> bool:
        return time.monotonic() >= self.at

    def synchronize(self) -> None:
        FakeEvent.waits += 1
        time.sleep(max(0.0, self.at - time.monotonic()))

    def elapsed_time(self, later) -> float:
        return (later.at - self.at) * 1e3
