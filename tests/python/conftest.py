"""Starts the release `shardserve` binary on the example repository for the
tritonclient compatibility suite, on free loopback ports, and stops it
(SIGTERM, expecting a clean exit 0) at the end of the session."""

import pytest

from serverproc import ROOT, ServerProcess


@pytest.fixture(scope="session")
def server():
    proc = ServerProcess([ROOT / "models"], log="python-suite-server.log")
    yield proc
    proc.stop_expecting_success()
