"""Every decision about an intent, and no I/O.

States and the transition table (``_states``), identity: key, scope and the one
fingerprint (``_identity``), verdicts on answers and look-ups (``_verdicts``), key age
(``_key_age``), leases (``_leases``), what a claim of an intent or of a webhook event
amounts to (``_claims``), the drive that sequences them all (``_drive``), and the records
they decide on (``_records``, which the journal stores). The clients and the journal carry
these out; they decide nothing themselves. Time and owner liveness come in as inputs
(``payonce._owners`` probes the latter).
"""

from ._claims import (
    Claim,
    ClaimKind,
    EventClaimKind,
    decide_claim,
    decide_event_claim,
    is_mismatch,
)
from ._guards import contract_table
from ._identity import (
    MAX_KEY_LENGTH,
    CanonicalRequest,
    FormData,
    FormEncoder,
    KeyFormat,
    canonical_request,
    check_headers,
    form_pairs,
    header_value_problem,
    journaled_fingerprint_matches,
    make_scope,
    new_key,
    request_differences,
    step_key,
    validate_key,
    validate_reference,
)
from ._key_age import KEY_LIFETIME_MARGIN, may_have_executed, resend_refusal
from ._leases import (
    EVENT_LEASE_SECONDS,
    abandon_blocked,
    default_lease_seconds,
    lease_blocks,
    lease_live,
)
from ._records import (
    AttemptRecord,
    IntentDraft,
    IntentRecord,
    IntentRequest,
    ReconciliationRecord,
    StoredResponse,
)
from ._states import (
    LOOKUP_UNRECORDED,
    MAY_HAVE_EXECUTED,
    NOTHING_CHANGED,
    NOTHING_SENT,
    RULES,
    IntentState,
    Rule,
    Transition,
    Unwritten,
    rule,
    target,
)
from ._verdicts import (
    LOOKUP_FAILURES,
    LookupKind,
    LookupVerdict,
    Outcome,
    ReconcileOutcome,
    Verdict,
    classify_error,
    classify_lookup,
    classify_lookup_error,
    classify_response,
    parse_retry_after,
    retry_after,
)
from ._verify import LOOK_UP, LookUp, Verification, quiet_after

__all__ = [
    "LOOKUP_UNRECORDED",
    "MAY_HAVE_EXECUTED",
    "NOTHING_CHANGED",
    "NOTHING_SENT",
    "Unwritten",
    "EVENT_LEASE_SECONDS",
    "KEY_LIFETIME_MARGIN",
    "LOOK_UP",
    "LOOKUP_FAILURES",
    "MAX_KEY_LENGTH",
    "RULES",
    "AttemptRecord",
    "CanonicalRequest",
    "Claim",
    "FormData",
    "FormEncoder",
    "ClaimKind",
    "EventClaimKind",
    "IntentDraft",
    "IntentRecord",
    "IntentRequest",
    "IntentState",
    "KeyFormat",
    "LookUp",
    "LookupKind",
    "LookupVerdict",
    "Outcome",
    "ReconcileOutcome",
    "ReconciliationRecord",
    "Rule",
    "StoredResponse",
    "Transition",
    "Verdict",
    "Verification",
    "canonical_request",
    "check_headers",
    "header_value_problem",
    "form_pairs",
    "journaled_fingerprint_matches",
    "request_differences",
    "step_key",
    "classify_error",
    "classify_lookup",
    "classify_lookup_error",
    "classify_response",
    "contract_table",
    "abandon_blocked",
    "decide_claim",
    "decide_event_claim",
    "default_lease_seconds",
    "is_mismatch",
    "lease_blocks",
    "lease_live",
    "make_scope",
    "may_have_executed",
    "new_key",
    "parse_retry_after",
    "retry_after",
    "quiet_after",
    "resend_refusal",
    "rule",
    "target",
    "validate_key",
    "validate_reference",
]
