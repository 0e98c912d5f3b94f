"""Fixtures of the unit tests."""

import pytest
import torch

from tests.fake_cuda import FakeEvent, FakeStream


@pytest.fixture
def fake_cuda(monkeypatch):
    """torch.cuda's stream and events replaced by fakes (tests/fake_cuda.py); returns the stream."""
    stream = FakeStream()
    FakeEvent.waits = 0
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: stream)
    monkeypatch.setattr(torch.cuda, "Event", FakeEvent)
    return stream
