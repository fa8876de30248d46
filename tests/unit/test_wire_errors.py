"""An error crosses the HTTP API as `{"error": {...}}` and the SDK raises the class it
came from: the service's encoder (service/common.py) and the SDK's decoder
(client/_common.py) against each other, for what each field carries."""

import pytest

from corral.client._common import _raise_raw
from corral.errors import PolicyError, SandboxSetupError
from corral.service.common import corral_error


def roundtrip(e):
    r = corral_error(e)
    with pytest.raises(type(e)) as got:
        _raise_raw(r.status_code, r.body)
    return r, got.value


def test_a_setup_errors_step_reaches_the_sdk():
    r, got = roundtrip(SandboxSetupError("the command could not be handed over: killed",
                                         step="handover"))
    assert b'"step":"handover"' in r.body.replace(b" ", b"")
    assert got.step == "handover" and got.message.startswith("the command could not")


def test_other_errors_carry_no_step():
    r, got = roundtrip(PolicyError("must be a table", field="limits"))
    assert b"step" not in r.body and r.status_code == 400
    assert got.field == "limits"
