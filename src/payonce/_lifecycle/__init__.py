"""Every decision about an intent, and no I/O.

States and the transition table (``_states``), identity: key, scope and the one
fingerprint (``_identity``), verdicts on answers and look-ups (``_verdicts``), key age
(``_key_age``), leases and owner liveness (``_leases``), what a claim amounts to
(``_claims``), and the records they decide on (``_records``, which the journal stores). The
clients and the journal drive these; they decide nothing themselves.
"""

from ._claims import Claim, ClaimKind, decide_claim, is_mismatch
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
    validate_key,
    validate_reference,
)
from ._key_age import KEY_LIFETIME_MARGIN, may_have_executed, resend_refusal
from ._leases import lease_blocks, lease_live, new_owner, owner_ended, owner_is_dead
from ._records import (
    AttemptRecord,
    IntentDraft,
    IntentRecord,
    IntentRequest,
    ReconciliationRecord,
    StoredResponse,
)
from ._states import RULES, IntentState, Rule, Transition, contract_table, rule, target
from ._verdicts import (
    LOOKUP_FAILURES,
    LookupKind,
    LookupVerdict,
    Outcome,
    Verdict,
    classify_error,
    classify_lookup,
    classify_lookup_error,
    classify_response,
    parse_retry_after,
    transition_for,
)
from ._verify import LOOK_UP, LookUp, Verification, quiet_after

__all__ = [
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
    "IntentDraft",
    "IntentRecord",
    "IntentRequest",
    "IntentState",
    "KeyFormat",
    "LookUp",
    "LookupKind",
    "LookupVerdict",
    "Outcome",
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
    "classify_error",
    "classify_lookup",
    "classify_lookup_error",
    "classify_response",
    "contract_table",
    "decide_claim",
    "is_mismatch",
    "lease_blocks",
    "lease_live",
    "make_scope",
    "may_have_executed",
    "new_key",
    "new_owner",
    "owner_ended",
    "owner_is_dead",
    "parse_retry_after",
    "quiet_after",
    "resend_refusal",
    "rule",
    "target",
    "transition_for",
    "validate_key",
    "validate_reference",
]
