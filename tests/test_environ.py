"""`shortcutlab.environ.environ`: variables set for a block, the old values back after it."""

from __future__ import annotations

import os

import pytest

from shortcutlab.environ import environ


def test_set_changed_and_unset_variables_come_back_even_after_an_error(monkeypatch):
    monkeypatch.setenv("SL_TEST_KEPT", "old")
    monkeypatch.setenv("SL_TEST_CHANGED", "old")
    monkeypatch.delenv("SL_TEST_NEW", raising=False)
    with pytest.raises(RuntimeError):
        with environ(SL_TEST_CHANGED="new", SL_TEST_NEW="added", SL_TEST_KEPT=None):
            assert (os.environ["SL_TEST_CHANGED"], os.environ["SL_TEST_NEW"], os.environ["SL_TEST_KEPT"]) == ("new", "added", "old")
            os.environ["SL_TEST_KEPT"] = "changed inside"  # None: not set, but given back too
            raise RuntimeError("the block failed")
    assert os.environ["SL_TEST_CHANGED"] == "old"
    assert "SL_TEST_NEW" not in os.environ
    assert os.environ["SL_TEST_KEPT"] == "old"
