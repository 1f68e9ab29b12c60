"""Where a request goes in its block: ``place``, the one rule, without I/O.

A request is matched to the block's journaled steps by what it is (its method and path,
then its occurrence among those), never by when it comes: conditional shop code run again
after a crash meets its own journaled steps, whichever it skips, adds or reorders.
"""

from __future__ import annotations

from payonce._lifecycle import IntentState
from payonce._lifecycle._steps import (
    AskedStep,
    Continue,
    JournaledStep,
    NewStep,
    PlacedStep,
    RefusalKind,
    Refuse,
    Replay,
    place,
)

CUSTOMER = ("POST", "/v1/customers", "fp-customer")
PAYMENT = ("POST", "/v1/payment_intents", "fp-payment")
CONFIRM = ("POST", "/v1/payment_intents/pi_1/confirm", "fp-confirm-card-a")
CONFIRM_B = ("POST", "/v1/payment_intents/pi_1/confirm", "fp-confirm-card-b")
CONFIRM_C = ("POST", "/v1/payment_intents/pi_1/confirm", "fp-confirm-card-c")
REFUND = ("POST", "/v1/refunds", "fp-refund")


def journaled(
    position: int,
    request: tuple[str, str, str],
    state: IntentState = IntentState.SUCCEEDED,
    *,
    declined: bool = False,
    key: str | None = None,
) -> JournaledStep:
    method, path, fingerprint = request
    return JournaledStep(
        position=position,
        method=method,
        path=path,
        fingerprint=fingerprint,
        key=key or f"KEY-step{position}",
        state=state,
        declined=declined,
    )


def placed(
    position: int,
    request: tuple[str, str, str],
    state: IntentState | None = IntentState.SUCCEEDED,
    *,
    answered: bool = True,
    caller_key: str | None = None,
) -> PlacedStep:
    method, path, fingerprint = request
    return PlacedStep(
        position=position,
        method=method,
        path=path,
        fingerprint=fingerprint,
        state=state,
        caller_key=caller_key,
        answered=answered,
    )


def asked(request: tuple[str, str, str], caller_key: str | None = None) -> AskedStep:
    method, path, fingerprint = request
    return AskedStep(method=method, path=path, fingerprint=fingerprint, caller_key=caller_key)


def test_a_blocks_first_request_with_nothing_journaled_is_step_1() -> None:
    assert place([], [], asked(PAYMENT)) == NewStep(1)


def test_the_next_request_of_a_fresh_block_is_the_next_position() -> None:
    assert place([], [placed(1, CUSTOMER)], asked(PAYMENT)) == NewStep(2)


def test_a_settled_journaled_step_is_replayed_and_an_unsettled_one_continued() -> None:
    steps = [journaled(1, CUSTOMER), journaled(2, PAYMENT, IntentState.PENDING)]

    assert place(steps, [], asked(CUSTOMER)) == Replay(1)
    assert place(steps, [placed(1, CUSTOMER)], asked(PAYMENT)) == Continue(2)
    failed = [journaled(1, PAYMENT, IntentState.FAILED)]
    assert place(failed, [], asked(PAYMENT)) == Replay(1)
    for state in (IntentState.UNKNOWN, IntentState.ABANDONED):
        assert place([journaled(1, PAYMENT, state)], [], asked(PAYMENT)) == Continue(1)


def test_the_customer_create_skipped_on_a_run_again_leaves_the_payment_at_its_own_step() -> None:
    # Run 1 created the customer, then the payment went out and the process died. Run 2
    # finds the customer at the shop, so its first request is the payment.
    steps = [journaled(1, CUSTOMER), journaled(2, PAYMENT, IntentState.PENDING)]

    assert place(steps, [], asked(PAYMENT)) == Continue(2)


def test_confirm_unless_already_confirmed_replays_the_create_and_sends_nothing_else() -> None:
    steps = [journaled(1, PAYMENT), journaled(2, CONFIRM)]

    assert place(steps, [], asked(PAYMENT)) == Replay(1)
    # The code reads the intent, sees it confirmed, and asks for nothing more: nothing to
    # place. Had it not been confirmed, the confirm meets its step:
    assert place(steps, [placed(1, PAYMENT)], asked(CONFIRM)) == Replay(2)


def test_reordered_steps_each_meet_their_own() -> None:
    steps = [journaled(1, CUSTOMER), journaled(2, PAYMENT), journaled(3, REFUND)]

    assert place(steps, [], asked(REFUND)) == Replay(3)
    assert place(steps, [placed(3, REFUND)], asked(CUSTOMER)) == Replay(1)
    assert place(steps, [placed(3, REFUND), placed(1, CUSTOMER)], asked(PAYMENT)) == Replay(2)


def test_a_step_added_on_a_run_again_takes_the_next_free_position() -> None:
    steps = [journaled(1, CUSTOMER), journaled(2, PAYMENT)]

    assert place(steps, [], asked(REFUND)) == NewStep(3)
    # Added before the journaled ones, it still comes after them: positions do not move.
    assert place(steps, [placed(3, REFUND)], asked(CUSTOMER)) == Replay(1)
    assert place(steps, [placed(3, REFUND), placed(1, CUSTOMER)], asked(PAYMENT)) == Replay(2)


def test_a_changed_body_at_its_occurrence_is_refused_naming_both_requests() -> None:
    steps = [journaled(1, CUSTOMER), journaled(2, PAYMENT, IntentState.PENDING)]
    other_amount = ("POST", "/v1/payment_intents", "fp-payment-other-amount")

    placement = place(steps, [placed(1, CUSTOMER)], asked(other_amount))

    assert placement == Refuse(RefusalKind.CHANGED, 2, steps[1], asked(other_amount))
    # Skipping the customer changes nothing to that: the payment meets step 2 all the same.
    assert place(steps, [], asked(other_amount)) == placement


def test_the_kth_request_of_an_endpoint_meets_the_kth_step_journaled_there() -> None:
    charge = ("POST", "/v1/charges", "fp-charge")
    steps = [journaled(1, CUSTOMER), journaled(2, charge), journaled(3, charge)]

    assert place(steps, [], asked(charge)) == Replay(2)
    assert place(steps, [placed(2, charge)], asked(charge)) == Replay(3)
    assert place(steps, [placed(2, charge), placed(3, charge)], asked(charge)) == NewStep(4)


def test_the_same_request_again_before_its_answer_is_that_step_again() -> None:
    # The caller's retry (or an SDK's) of a step that raised: never a second step.
    raised = placed(1, PAYMENT, IntentState.PENDING, answered=False)

    assert place([], [raised], asked(PAYMENT)) == Continue(1)
    unknown = placed(2, CONFIRM, IntentState.UNKNOWN, answered=False)
    assert place([], [placed(1, PAYMENT), unknown], asked(CONFIRM)) == Continue(2)
    refused = placed(1, PAYMENT, IntentState.FAILED, answered=False)
    assert place([], [refused], asked(PAYMENT)) == Replay(1)


def test_the_same_request_again_after_its_success_is_a_second_one_on_purpose() -> None:
    # A split payment: two identical charges, each under its own key.
    assert place([], [placed(1, PAYMENT)], asked(PAYMENT)) == NewStep(2)
    # Run again, the repeat meets the second journaled one.
    steps = [journaled(1, PAYMENT), journaled(2, PAYMENT)]
    assert place(steps, [placed(1, PAYMENT)], asked(PAYMENT)) == Replay(2)


def test_a_repeat_while_a_step_has_not_succeeded_is_refused_as_a_retry_loop() -> None:
    done = placed(1, PAYMENT)
    declined = placed(2, CONFIRM, IntentState.FAILED, answered=False)

    placement = place([], [done, declined], asked(PAYMENT))

    assert placement == Refuse(RefusalKind.REPEATED, 1, done, asked(PAYMENT), declined)


def test_a_declined_step_is_passed_over_by_another_card() -> None:
    declined = journaled(2, CONFIRM, IntentState.FAILED, declined=True)

    assert place([journaled(1, PAYMENT), declined], [placed(1, PAYMENT)], asked(CONFIRM_B)) == (
        NewStep(3)
    )
    # Run again as it was (A declined, then B): each card meets its own step.
    steps = [journaled(1, PAYMENT), declined, journaled(3, CONFIRM_B)]
    assert place(steps, [placed(1, PAYMENT)], asked(CONFIRM)) == Replay(2)
    a_replayed = placed(2, CONFIRM, IntentState.FAILED, answered=False)
    assert place(steps, [placed(1, PAYMENT), a_replayed], asked(CONFIRM_B)) == Replay(3)
    # With B alone, B passes A over and replays its own step; with a third card C, it is
    # refused at B's step, which succeeded (a second payment).
    assert place(steps, [placed(1, PAYMENT)], asked(CONFIRM_B)) == Replay(3)
    refused = place(steps, [placed(1, PAYMENT)], asked(CONFIRM_C))
    assert refused == Refuse(RefusalKind.CHANGED, 3, steps[2], asked(CONFIRM_C))


def test_only_a_declined_step_is_passed_over() -> None:
    for state in IntentState:
        not_declined = journaled(2, CONFIRM, state)
        placement = place([journaled(1, PAYMENT), not_declined], [], asked(CONFIRM_B))
        assert placement == Refuse(RefusalKind.CHANGED, 2, not_declined, asked(CONFIRM_B))


def test_a_request_under_a_key_the_caller_set_never_passes_a_step_over() -> None:
    declined = journaled(2, CONFIRM, IntentState.FAILED, declined=True)

    placement = place([journaled(1, PAYMENT), declined], [], asked(CONFIRM_B, "order-1-pay"))

    assert placement == Refuse(RefusalKind.CHANGED, 2, declined, asked(CONFIRM_B, "order-1-pay"))


def test_a_key_the_caller_set_names_its_step() -> None:
    steps = [journaled(1, PAYMENT), journaled(2, CONFIRM, key="order-1-confirm")]

    assert place(steps, [], asked(CONFIRM, "order-1-confirm")) == Replay(2)
    mine = placed(2, CONFIRM, IntentState.PENDING, answered=False, caller_key="order-1-confirm")
    assert place([], [placed(1, PAYMENT), mine], asked(CONFIRM, "order-1-confirm")) == Continue(2)
    # Under that key, another request is a changed step, wherever it comes.
    changed = place(steps, [], asked(REFUND, "order-1-confirm"))
    assert changed == Refuse(RefusalKind.CHANGED, 2, steps[1], asked(REFUND, "order-1-confirm"))


def test_a_new_position_comes_after_every_journaled_one_gaps_included() -> None:
    steps = [journaled(1, CUSTOMER), journaled(4, PAYMENT)]

    assert place(steps, [placed(1, CUSTOMER)], asked(REFUND)) == NewStep(5)
