"""What makes an intent the same intent: its key, its scope and its one fingerprint."""

from __future__ import annotations

import hashlib
import json
import re
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Literal, Protocol
from urllib.parse import parse_qsl, urlencode, urlsplit

import attrs

from ..errors import ConfigurationError

__all__ = [
    "MAX_KEY_LENGTH",
    "CanonicalRequest",
    "KeyFormat",
    "FormData",
    "FormEncoder",
    "canonical_request",
    "check_headers",
    "form_pairs",
    "JournaledRequest",
    "header_value_problem",
    "journaled_fingerprint_matches",
    "make_scope",
    "scope_path",
    "new_key",
    "request_differences",
    "step_key",
    "step_of_reference",
    "step_reference",
    "validate_key",
    "validate_reference",
]

KeyFormat = Literal["ulid", "uuid4"]

MAX_KEY_LENGTH = 255


def new_key(key_format: KeyFormat = "ulid") -> str:
    """A fresh idempotency key: a ULID (sortable by creation time) or a random UUIDv4."""
    if key_format == "ulid":
        # Imported on first use: python-ulid reads its own package metadata on import,
        # which ``import payonce`` need not pay for. A hand-spelt ULID would save about
        # 2 µs of the ~600 an intent costs: not worth owning an encoder for.
        from ulid import ULID

        return str(ULID())
    if key_format == "uuid4":
        return str(uuid.uuid4())
    raise ConfigurationError(f"key_format must be 'ulid' or 'uuid4', not {key_format!r}")


_STEP_HASH_LENGTH = 16


def step_key(intent_key: str, step: int, *, max_length: int = MAX_KEY_LENGTH) -> str:
    """The key of step ``step`` (2 and later) of the intent whose key is ``intent_key``.

    Derived, never drawn: the same intent's step n has the same key in every process, so a
    re-run after a crash finds step n journaled under it. ``KEY-step2`` while that fits the
    provider's limit (Square takes 45 characters, Adyen 64); otherwise the key's head, a
    hash of the whole key (two long keys sharing a head still differ) and the position.
    """
    if step < 2:
        raise ValueError(f"step 1 is the intent itself, keyed {intent_key!r}; got step {step}")
    suffix = f"-step{step}"
    if len(intent_key) + len(suffix) <= max_length:
        return intent_key + suffix
    digest = hashlib.sha256(intent_key.encode()).hexdigest()[:_STEP_HASH_LENGTH]
    head = intent_key[: max(0, max_length - len(suffix) - _STEP_HASH_LENGTH - 1)]
    return f"{head}~{digest}{suffix}"[-max_length:]


_STEP_REFERENCE = re.compile(r"(.+)#step([0-9]+)")


def step_reference(intent: str, step: int) -> str:
    """The reference of step ``step`` (2 and later) of the intent named ``intent`` (its
    reference, else its key): ``order-1#step2``.

    Journaled with the step, it binds the step's position to the key it was first
    journaled under, as a reference binds step 1: a run again whose step n carries another
    key (one the caller's code draws per call, a uuid4) is refused before anything is
    sent, instead of being a new step that pays again. Readable in ``payonce intents
    list``, typed without quoting, and unlike an order id a caller would choose.
    """
    if step < 2:
        raise ValueError(f"step 1 is the intent itself, named {intent!r}; got step {step}")
    return f"{intent}#step{step}"


def step_of_reference(reference: str | None) -> tuple[str, int] | None:
    """(the intent's reference or key, the position) of a step's reference; None for any
    other reference (an intent's own)."""
    if reference is None or (match := _STEP_REFERENCE.fullmatch(reference)) is None:
        return None
    step = int(match.group(2))
    return (match.group(1), step) if step >= 2 else None


def validate_key(key: str, *, max_length: int = MAX_KEY_LENGTH) -> str:
    """Check a caller-supplied key: 1..max_length printable ASCII characters."""
    if not isinstance(key, str) or not key:
        raise ConfigurationError("an idempotency key must be a non-empty string")
    if len(key) > max_length:
        raise ConfigurationError(
            f"idempotency key is {len(key)} characters long; this provider accepts at most "
            f"{max_length}"
        )
    if not all(0x20 < ord(ch) < 0x7F for ch in key):
        raise ConfigurationError(
            "an idempotency key may contain only printable ASCII characters (no spaces, "
            "no control characters)"
        )
    return key


def validate_reference(reference: str, *, required: bool = False) -> str:
    """Check a caller's reference (an order id): the same reference is the same intent, so
    one that is empty, blank, padded or holds control characters is refused rather than
    let two orders that a caller's bug gave the same blank name share one payment.
    ``required``: the caller may not leave it out (``enqueue``), so that is not offered."""
    if not isinstance(reference, str):
        raise ConfigurationError(
            f"reference must be a string, not {type(reference).__name__} ({reference!r}): "
            "pass str(...) of your order id"
        )
    if not reference.strip():
        raise ConfigurationError(
            f"reference {reference!r} is empty or blank: every order it stood for would be "
            "one intent, paid once. Pass the order's id"
            + ("" if required else ", or no reference at all")
        )
    if reference != reference.strip():
        raise ConfigurationError(
            f"reference {reference!r} starts or ends with whitespace, so it differs from "
            f"the same id without it: strip it in your code. {_EARLIER}"
        )
    if _CONTROL.search(reference):
        raise ConfigurationError(
            f"reference {reference!r} holds a control character (a newline, a tab, NUL…). "
            f"{_EARLIER}"
        )
    if (suffix := _STEP_SUFFIX.search(reference)) is not None:
        base = reference[: suffix.start()]
        renamed = base + "-" + suffix.group()[1:]
        raise ConfigurationError(
            f"reference {reference!r} ends in {suffix.group()!r}, which payonce keeps for the "
            f"references of a block's later steps (step 2 of the block of intent {base!r} "
            f"is journaled as {base + '#step2'!r}): a reference of your own in that form "
            "would be taken for such a step. Nothing was journaled or sent. Name a new "
            f"order without that ending, e.g. {renamed!r}. "
            + _earlier(f"the renamed reference ({renamed!r})")
        )
    return reference


_STEP_SUFFIX = re.compile(r"#step[0-9]+\Z")
"""How a step's reference ends (``step_reference``): no caller's reference may."""


def _earlier(other: str) -> str:
    """The warning a refused reference carries: ``other``, the reference the caller would
    use instead, is another intent than the ones an earlier payonce journaled under it."""
    return (
        "If an earlier payonce journaled intents under it, they keep their keys: find them "
        "with `payonce intents list`, finish pending ones with `payonce resume` and "
        f"reconcile unknown ones; {other} is another intent, and paying one of them under "
        "it again would pay twice"
    )


_EARLIER = _earlier("the stripped reference")


def make_scope(account: str, method: str, path: str) -> str:
    """The endpoint an intent's request goes to, in its account (journaled as ``scope``):
    what its fingerprint is checked against before a resend. It names no intent: an
    intent is found by its identity and reference (``IntentRequest.identity``)."""
    return f"{account} {method.upper()} {path}"


def scope_path(scope: str, *, account: str, method: str) -> str:
    """The path of a ``make_scope(account, method, path)``."""
    return scope[len(account) + len(method) + 2 :]


@attrs.frozen
class CanonicalRequest:
    """A request in the one form payonce sends, stores and fingerprints.

    ``body`` holds the exact bytes sent on every attempt; ``query_pairs`` and
    ``canonical_body`` are what the fingerprint is computed over, so dict ordering never
    makes a retry look different.
    """

    method: str
    path: str
    query: str
    query_pairs: tuple[tuple[str, str], ...]
    content_type: str | None
    body: bytes
    canonical_body: bytes

    @property
    def target(self) -> str:
        return f"{self.path}?{self.query}" if self.query else self.path

    @property
    def fingerprint(self) -> str:
        """The fingerprint of this request sent without meaningful headers."""
        return self.fingerprint_with(())

    def fingerprint_with(self, headers: Sequence[tuple[str, str]]) -> str:
        """The one fingerprint of an intent: SHA-256 of everything that makes two requests
        the same request.

        Method, path, the sorted query pairs, the content type and the canonical body; then
        the headers that change what the request does (lower-case names, sorted), such as
        ``Stripe-Account``. Without such headers the value is the body's alone, so journals
        written before headers counted keep their fingerprints.
        """
        digest = hashlib.sha256()
        query = urlencode(sorted(self.query_pairs)) if self.query_pairs else ""
        for part in (self.method, self.path, query, self.content_type or ""):
            digest.update(part.encode())
            digest.update(b"\x00")
        digest.update(self.canonical_body)
        value = digest.hexdigest()
        if not headers:
            return value
        with_headers = hashlib.sha256(value.encode())
        for name, header_value in sorted(headers):
            with_headers.update(f"\x00{name}:{header_value}".encode())
        return with_headers.hexdigest()


_CANONICAL_JSON = json.JSONEncoder(
    sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
)
"""Built once: ``json.dumps`` with these arguments builds an encoder on every call."""


def _canonical_json(value: Any) -> bytes:
    return _CANONICAL_JSON.encode(value).encode()


FormData = Mapping[str, Any] | Sequence[tuple[str, Any]]
FormEncoder = Callable[[FormData], list[tuple[str, str]]]


def form_pairs(data: FormData) -> list[tuple[str, str]]:
    """A form's pairs the plain way: a list or tuple value repeats its key, None is empty."""
    return _form_pairs(data)


def _form_pairs(data: FormData) -> list[tuple[str, str]]:
    items = data.items() if isinstance(data, Mapping) else data
    if isinstance(items, str | bytes) or not isinstance(items, Iterable):
        raise ConfigurationError(
            f"params= and data= take a mapping or a sequence of (name, value) pairs, not "
            f"{type(data).__name__}"
        )
    pairs: list[tuple[str, str]] = []
    for pair in items:
        if not isinstance(pair, tuple | list) or len(pair) != 2:
            raise ConfigurationError(
                f"params= and data= take (name, value) pairs; got {type(pair).__name__} "
                f"{pair!r:.40}"
            )
        name, value = pair
        values = value if isinstance(value, list | tuple) else [value]
        pairs.extend((str(name), "" if v is None else str(v)) for v in values)
    return pairs


_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
"""An HTTP token (RFC 9110): what a method or a header name may be made of."""
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_FIELD_VALUE = re.compile(r"[\t\x20-\x7e]*")
"""Printable ASCII and tabs: what every HTTP/1.1 stack sends a header value as, the same."""


def header_value_problem(value: str) -> str | None:
    """Why no HTTP stack would send ``value`` as given in a header, or None when one would.

    Never quotes the value: it may be a secret. Leading or trailing whitespace counts: h11
    refuses to write it (its field-value rule), and a stack that accepts it strips it, so
    what is sent is not what was given.
    """
    if value != value.strip():
        return "starts or ends with whitespace (a space, a tab, a line break)"
    if not value.isascii():
        return "holds a non-ASCII character"
    if not _FIELD_VALUE.fullmatch(value):
        return "holds a line break or another control character"
    return None


_FORM = "application/x-www-form-urlencoded"


def _canonical_bodies(content_type: str | None, body: bytes) -> list[bytes]:
    """What a journaled body may have been fingerprinted as: the body itself and, for a
    form, its sorted pairs (raw content= sent with a form content type was fingerprinted as
    it is, a data= form by its sorted pairs; either may be what this one was)."""
    candidates = [body]
    if (content_type or "").split(";")[0].strip().lower() == _FORM:
        pairs = sorted(parse_qsl(body.decode("latin-1"), keep_blank_values=True))
        candidates.append(urlencode(pairs).encode("latin-1"))
    return candidates


class JournaledRequest(Protocol):
    """A request as an intent journals it (a draft or a record)."""

    @property
    def url(self) -> str: ...
    @property
    def request_headers(self) -> tuple[tuple[str, str], ...]: ...
    @property
    def body(self) -> bytes: ...


def request_differences(first: JournaledRequest, again: JournaledRequest) -> list[str]:
    """What makes ``again`` another request than ``first`` of the same method and path: the
    parts the fingerprint covers that differ, in words. Headers by name (lower case), never
    by value: a value is not for an error message."""
    found: list[str] = []

    def query(request: JournaledRequest) -> list[tuple[str, str]]:
        return sorted(parse_qsl(urlsplit(request.url).query, keep_blank_values=True))

    if query(first) != query(again):
        found.append("the query string")
    before, after = dict(first.request_headers), dict(again.request_headers)
    content_types = before.pop("content-type", None), after.pop("content-type", None)
    if content_types[0] != content_types[1]:
        found.append("the content type")
    bodies = _canonical_bodies(content_types[0], first.body)
    if not set(bodies) & set(_canonical_bodies(content_types[1], again.body)):
        fields = _fields_differing(first.body, again.body)
        named = f" ({'field' if len(fields) == 1 else 'fields'} {', '.join(fields)})"
        found.append("the body" + (named if fields else ""))
    for name in sorted(before.keys() | after.keys()):
        if name not in before:
            found.append(f"header {name} (not sent the first time)")
        elif name not in after:
            found.append(f"header {name} (sent the first time, not now)")
        elif before[name] != after[name]:
            found.append(f"header {name} (another value)")
    return found


def _fields_differing(first: bytes, again: bytes) -> list[str]:
    """The fields two JSON-object or form bodies differ in, by name (dotted into nested
    objects), never by value; none when they are not both objects or both forms."""
    try:
        before, after = json.loads(first), json.loads(again)
    except ValueError:
        try:
            before = _form_fields(first.decode("latin-1"))
            after = _form_fields(again.decode("latin-1"))
        except ValueError:
            return []
    if not isinstance(before, dict) or not isinstance(after, dict):
        return []
    return _paths_differing(before, after, "")


def _form_fields(body: str) -> dict[str, list[str]]:
    fields: dict[str, list[str]] = {}
    for name, value in parse_qsl(body, keep_blank_values=True, strict_parsing=bool(body)):
        fields.setdefault(name, []).append(value)
    return fields


def _paths_differing(before: dict[str, Any], after: dict[str, Any], prefix: str) -> list[str]:
    found: list[str] = []
    for name in sorted(before.keys() | after.keys()):
        first, again = before.get(name, _ABSENT), after.get(name, _ABSENT)
        if first == again:
            continue
        if isinstance(first, dict) and isinstance(again, dict):
            found.extend(_paths_differing(first, again, f"{prefix}{name}."))
        else:
            found.append(f"{prefix}{name}")
    return found


_ABSENT = object()


def journaled_fingerprint_matches(
    *,
    method: str,
    path: str,
    url: str,
    request_headers: Sequence[tuple[str, str]],
    body: bytes,
    fingerprint: str,
) -> bool:
    """Whether a journaled request still is the one its fingerprint was made of: checked
    before a resend, so that a row edited by hand is never sent in the intent's name."""
    content_type = dict(request_headers).get("content-type")
    meaningful = [(name, value) for name, value in request_headers if name != "content-type"]
    query_pairs = tuple(parse_qsl(urlsplit(url).query, keep_blank_values=True))
    for canonical_body in _canonical_bodies(content_type, body):
        request = CanonicalRequest(
            method=method,
            path=path,
            query=urlencode(query_pairs),
            query_pairs=query_pairs,
            content_type=content_type,
            body=body,
            canonical_body=canonical_body,
        )
        if request.fingerprint_with(meaningful) == fingerprint:
            return True
    return False


def check_headers(headers: Mapping[str, str] | None) -> None:
    """Refuse, before anything is journaled, headers no HTTP stack could send as given."""
    if headers is not None and not isinstance(headers, Mapping):
        raise ConfigurationError(
            f"headers= takes a mapping of names to values (a dict), not {type(headers).__name__}"
        )
    for name, value in (headers or {}).items():
        if not isinstance(name, str) or not _TOKEN.fullmatch(name):
            raise ConfigurationError(f"header name {name!r} is not a valid HTTP header name")
        problem = header_value_problem(value) if isinstance(value, str) else "is not a str"
        if problem is not None:
            raise ConfigurationError(
                f"the value of header {name!r} {problem}: a header value is printable ASCII "
                "text (no CR, LF, NUL or other control characters) with nothing to strip at "
                "either end. Encode or strip it first"
            )


def canonical_request(
    method: str,
    path: str,
    *,
    params: Mapping[str, Any] | None = None,
    json_body: Any = None,
    form: FormData | None = None,
    form_encoder: FormEncoder = form_pairs,
    content: bytes | None = None,
    content_type: str | None = None,
) -> CanonicalRequest:
    """Build the canonical request: JSON with sorted keys and no insignificant whitespace;
    form bodies and query strings as sorted pairs; raw content as it is."""
    method = method.upper()
    if not _TOKEN.fullmatch(method):
        raise ConfigurationError(f"request method {method!r} is not an HTTP method name")
    if not isinstance(path, str) or not path.startswith("/"):
        raise ConfigurationError(f"request path must start with '/', got {path!r}")
    if _CONTROL.search(path):
        raise ConfigurationError(
            f"request path {path!r} holds a control character (CR, LF, NUL…): it cannot be sent"
        )
    path, _, inline_query = path.partition("?")
    query_pairs = parse_qsl(inline_query, keep_blank_values=True) if inline_query else []
    if params:
        query_pairs.extend(_form_pairs(params))

    given = sum(x is not None for x in (json_body, form, content))
    if given > 1:
        raise ConfigurationError("pass at most one of json=, data= and content=")
    if json_body is not None:
        try:
            body = _canonical_json(json_body)
        except (TypeError, ValueError) as exc:
            raise ConfigurationError(f"json= body cannot be encoded as JSON: {exc}") from exc
        except RecursionError:
            raise ConfigurationError("json= body is nested too deeply to encode") from None
        canonical_body = body
        content_type = content_type or "application/json"
    elif form is not None:
        pairs = form_encoder(form)
        # Brackets stay literal, as in Stripe's own SDK: servers read them either way.
        body = urlencode(pairs, safe="[]").encode()
        canonical_body = urlencode(sorted(pairs)).encode()
        content_type = content_type or "application/x-www-form-urlencoded"
    elif content is not None:
        if not isinstance(content, bytes | bytearray | memoryview):
            raise ConfigurationError(
                f"content= takes bytes, not {type(content).__name__}: encode the text "
                "yourself (e.g. text.encode()), so that every attempt sends the same bytes"
            )
        body = bytes(content)
        canonical_body = body
    else:
        body = b""
        canonical_body = b""
    return CanonicalRequest(
        method=method,
        path=path,
        query=urlencode(query_pairs) if query_pairs else "",
        query_pairs=tuple(query_pairs),
        content_type=content_type,
        body=body,
        canonical_body=canonical_body,
    )
