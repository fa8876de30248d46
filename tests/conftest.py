import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CORRAL = os.path.join(ROOT, ".venv", "bin", "corral")
PY = "/usr/bin/python3"


@pytest.fixture(scope="session")
def corral_bin():
    assert os.access(CORRAL, os.X_OK), "run scripts/setup.sh first"
    return CORRAL


def pytest_report_header(config):
    return f"corral tests as uid {os.geteuid()}, python {sys.version.split()[0]}"
