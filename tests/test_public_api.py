"""The public namespace is curated: one sorted __all__, every name real, nothing private."""

from __future__ import annotations

import payonce
import payonce.errors


def test_all_is_sorted_and_complete() -> None:
    assert list(payonce.__all__) == sorted(payonce.__all__)
    for name in payonce.__all__:
        assert hasattr(payonce, name), name


def test_every_error_is_exported_and_derives_from_the_one_root() -> None:
    for name in payonce.errors.__all__:
        assert getattr(payonce, name) is getattr(payonce.errors, name)
        assert issubclass(getattr(payonce, name), payonce.PayonceError)


def test_there_is_one_exception_root() -> None:
    assert issubclass(payonce.JournalBusy, payonce.JournalError)
    assert issubclass(payonce.IntentMismatch, payonce.IntentError)
    assert issubclass(payonce.OutcomeUnknown, payonce.IntentError)
    assert issubclass(payonce.ConfigurationError, ValueError)
