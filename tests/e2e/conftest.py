"""The `e2e` marker, given by this folder: every test collected under it starts real processes."""

from __future__ import annotations

from pathlib import Path

import pytest

E2E = Path(__file__).parent


# tryfirst: the marker must be on the items before `-m` deselects by it (in the mark plugin's
# own pytest_collection_modifyitems).
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.path.is_relative_to(E2E):
            item.add_marker(pytest.mark.e2e)
