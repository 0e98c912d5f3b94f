import shutil
from pathlib import Path

import pytest

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
RESULTS = FIXTURES / "results"
OLD_SCHEMA = FIXTURES / "old-schema"


@pytest.fixture
def results(tmp_path) -> Path:
    """A writable copy of the checked-in result fixtures (reports are written beside them)."""
    copy = tmp_path / "results"
    shutil.copytree(RESULTS, copy)
    return copy
