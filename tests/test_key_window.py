"""The key window's own rules (``payonce._lifecycle._key_age``): what a key's age is judged
by when the provider's time now cannot be read, and how a later reading of the provider's
clock moves a window taken earlier."""

from __future__ import annotations

from payonce._lifecycle._key_age import KeyWindow, resend_refusal


def test_without_the_provider_s_time_now_its_journaled_dates_judge_the_key_too() -> None:
    # This host's clock says 800 s since the first send; the provider dated its answer to
    # it 950 s ago by this host's clock now (this host's clock was ahead then): refused.
    lifetime = 1000.0
    assert resend_refusal(100.0, now=900.0, key_lifetime=lifetime) is None
    by_first = resend_refusal(100.0, now=900.0, key_lifetime=lifetime, provider_first=-50.0)
    assert by_first is not None
    assert "could not be read now" in by_first
    assert "dates that attempt 950s ago" in by_first
    by_any = resend_refusal(100.0, now=900.0, key_lifetime=lifetime, provider_sent_by=-10.0)
    assert by_any is not None
    assert "answered an attempt 910s ago" in by_any
    # Dates that leave the key young change nothing; none are read for a key never sent.
    assert resend_refusal(100.0, now=900.0, key_lifetime=lifetime, provider_first=150.0) is None
    never = resend_refusal(100.0, now=900.0, key_lifetime=lifetime, executed=False)
    assert never is None


def test_a_key_window_takes_a_later_reading_of_the_provider_s_clock_never_an_earlier() -> None:
    window = KeyWindow(
        first_sent_at=1000.0,
        key_lifetime=1000.0,
        now=1010.0,
        provider_now=1010.0,
        provider_first=1000.0,
        provider_sent_by=1000.0,
        within=None,
        taken_at=50.0,
    )
    assert window.refusal_at(60.0) is None  # 20 s old
    # Read 10 s later: the provider's clock jumped 880 s ahead; the key is 900 s old there.
    jumped = window.read(1900.0, monotonic=60.0)
    refusal = jumped.refusal_at(80.0)
    assert refusal is not None
    assert "by the provider's clock it was first sent 920s ago" in refusal
    # Read as earlier than carried forward (its clock stepped back): no key gets younger.
    assert jumped.read(1000.0, monotonic=80.0) == jumped
    assert window.read(None, monotonic=60.0) == window
