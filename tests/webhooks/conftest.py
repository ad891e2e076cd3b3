"""Fixtures of the webhook tests.

``herald_url`` the shared server's URL (tests/conftest.py ``shared_herald``), for the
               tests that never stop it: each names its own topics and subscriptions.
``storage``    a real Storage on a temp dir with a topic ``t`` of one partition, for the
               tests that drive a dispatcher in this process.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from storage.config import TopicConfig
from storage.engine import Storage
from tests.conftest import HeraldProcess


@pytest.fixture
def herald_url(shared_herald: HeraldProcess) -> str:
    return shared_herald.url


@pytest.fixture
async def storage(tmp_path: Path) -> AsyncIterator[Storage]:
    opened = await Storage.open(tmp_path / "data")
    await opened.ensure_topic("t", TopicConfig(partitions=1))
    yield opened
    await opened.close()
