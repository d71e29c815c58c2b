"""Fixtures for the MangleCP tests (helpers live in `helpers.py`)."""

from __future__ import annotations

import pytest

from ftl.manglecp.access import BearerAuth, Principal
from ftl.manglecp.server import ManglecpServer

from .helpers import FakeClock, make_evaluator, make_server


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def server(clock: FakeClock) -> ManglecpServer:
    srv = make_server(clock=clock)
    yield srv
    srv.close()


@pytest.fixture
def auth() -> BearerAuth:
    return BearerAuth({"good-token": Principal("alice"),
                       "narrow-token": Principal("bob", permissions=frozenset({"levels"})),
                       "robot-token": Principal("robot", trust_level="automated",
                                                auto_confirm_effects=frozenset({"payments"}))})


@pytest.fixture(scope="session")
def process_evaluator():
    evaluator = make_evaluator("process")
    yield evaluator
    evaluator.close()
