"""What a request to Stripe's v1 API says: nested form parameters and Search API queries,
read the way Stripe reads them; anything malformed is a 400 in Stripe's words.

Form bodies nest with brackets, as stripe-python encodes them: ``metadata[order]=42``,
``payment_method_types[0]=card`` (or ``[]``), ``automatic_payment_methods[enabled]=true``.
A search query is one or more clauses joined by ``AND`` or by ``OR`` (not both, as in
Stripe): ``metadata['order']:'42'``, ``status:'succeeded'``, ``currency:'eur'``,
``amount>1000``, ``created<=1700000000``, a leading ``-`` negating one.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable, Mapping
from typing import Any, Final
from urllib.parse import parse_qsl

import attrs

from payonce.sandbox._errors import ApiError
from payonce.sandbox._intents import StripeIntent

__all__ = ["SearchQuery", "form_params", "fingerprint"]

_NAME: Final = re.compile(r"([^\[\]]+)((?:\[[^\[\]]*\])*)")
_SUBSCRIPT: Final = re.compile(r"\[([^\[\]]*)\]")
_MAX_CLAUSES: Final = 10


def _invalid(message: str, param: str | None = None, type_: str = "invalid_request") -> ApiError:
    return ApiError(400, type_, message, fields={} if param is None else {"param": param})


def form_params(body: bytes) -> dict[str, Any]:
    """A form body as the nested object it stands for (lists for indexed names)."""
    try:
        pairs = parse_qsl(body.decode(), keep_blank_values=True, strict_parsing=bool(body))
    except ValueError:  # UnicodeDecodeError included
        raise _invalid("The request body is not valid form data.") from None
    data: dict[str, Any] = {}
    for name, value in pairs:
        match = _NAME.fullmatch(name)
        if match is None:
            raise _invalid(f"Invalid parameter name: {name}.", name)
        path = [match.group(1), *_SUBSCRIPT.findall(match.group(2))]
        _put(data, path, value, name)
    return {name: _listed(value) for name, value in data.items()}


def _put(data: dict[str, Any], path: list[str], value: str, name: str) -> None:
    target = data
    for part in path[:-1]:
        child = target.setdefault(part, {})
        if not isinstance(child, dict):
            raise _invalid(f"Invalid parameter: {name} mixes a value and a hash.", name)
        target = child
    last = path[-1]
    if last == "":  # name[]: the next index
        last = str(len(target))
    if last in target:
        raise _invalid(f"Received {name} more than once.", name)
    target[last] = value


def _listed(value: Any) -> Any:
    # A hash whose keys are 0, 1, 2... is how a form spells a list.
    if not isinstance(value, dict):
        return value
    items = {key: _listed(item) for key, item in value.items()}
    if items and all(key.isdigit() for key in items):
        return [items[key] for key in sorted(items, key=int)]
    return items


def fingerprint(endpoint: str, params: Mapping[str, Any]) -> str:
    """``endpoint`` and a hash of its parameters: the same parameters in any order hash the
    same, and the endpoint stays readable, to word a key reused on another one."""
    canonical = json.dumps(params, sort_keys=True, separators=(",", ":"))
    return f"{endpoint} {hashlib.sha256(canonical.encode()).hexdigest()}"


def endpoint_of(request_hash: str) -> str:
    """The endpoint a stored request hash names ("" for one that names none)."""
    endpoint, _, digest = request_hash.rpartition(" ")
    return endpoint if digest else ""


# -- the Search API ------------------------------------------------------------------------

_QUOTED: Final = r"'(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\""
_CLAUSE: Final = re.compile(
    rf"(?P<negated>-)?(?:metadata\[(?P<key>{_QUOTED})\]|(?P<field>[a-z_]+))"
    rf"\s*(?P<op>:|>=|<=|>|<|~)\s*(?P<value>{_QUOTED}|-?\d+|null)"
)
_JOIN: Final = re.compile(r"\s+(AND|OR)\s+")
_STRING_FIELDS: Final = frozenset({"status", "currency", "customer"})
_NUMBER_FIELDS: Final = frozenset({"amount", "created"})

Predicate = Callable[[StripeIntent], bool]


def _unquote(text: str) -> str:
    return re.sub(r"\\(.)", r"\1", text[1:-1])


def _compare(op: str, have: Any, want: Any) -> bool:
    if have is None or want is None:
        return op == ":" and have == want
    if op == ":":
        return bool(have == want)
    if op == "~":
        return str(want) in str(have)
    if not isinstance(have, int) or not isinstance(want, int):
        return False
    return {">": have > want, "<": have < want, ">=": have >= want, "<=": have <= want}[op]


def _field_value(intent: StripeIntent, field: str) -> Any:
    if field == "created":
        return int(intent.created_at)
    return intent.to_json()[field]


@attrs.frozen
class _Clause:
    negated: bool
    key: str | None
    field: str | None
    op: str
    value: str | int | None

    def __call__(self, intent: StripeIntent) -> bool:
        if self.key is not None:
            have: Any = intent.metadata.get(self.key)
        else:
            assert self.field is not None
            have = _field_value(intent, self.field)
        return _compare(self.op, have, self.value) != self.negated


@attrs.frozen
class SearchQuery:
    """A parsed query: its clauses and whether all (AND) or any (OR) must hold."""

    clauses: tuple[_Clause, ...]
    any_of: bool = False

    @classmethod
    def parse(cls, query: str) -> SearchQuery:
        text = query.strip()
        if not text:
            raise _invalid("Missing required param: query.", "query", "parameter_missing")
        # Clause by clause, so that AND or OR inside a quoted value is part of the value.
        clauses: list[_Clause] = []
        joins: set[str] = set()
        position = 0
        while True:
            match = _CLAUSE.match(text, position)
            if match is None:
                raise _invalid(f"Invalid search query at: {text[position:]!r}.", "query")
            clauses.append(_clause(match))
            position = match.end()
            if position == len(text):
                break
            join = _JOIN.match(text, position)
            if join is None:
                raise _invalid(f"Invalid search query at: {text[position:]!r}.", "query")
            joins.add(join.group(1))
            position = join.end()
        if len(joins) > 1:
            raise _invalid("A search query cannot mix AND and OR.", "query")
        if len(clauses) > _MAX_CLAUSES:
            raise _invalid(f"A search query has at most {_MAX_CLAUSES} clauses.", "query")
        return cls(tuple(clauses), any_of=joins == {"OR"})

    def __call__(self, intent: StripeIntent) -> bool:
        found = (clause(intent) for clause in self.clauses)
        return any(found) if self.any_of else all(found)


def _clause(match: re.Match[str]) -> _Clause:
    op, raw = match.group("op"), match.group("value")
    key, field = match.group("key"), match.group("field")
    value: str | int | None
    if raw == "null":
        value = None
    elif raw[0] in "'\"":
        value = _unquote(raw)
    else:
        value = int(raw)
    if key is not None:
        if op not in (":", "~") or isinstance(value, int):
            raise _invalid("metadata is searched with : or ~ and a quoted value.", "query")
        return _Clause(match.group("negated") == "-", _unquote(key), None, op, value)
    if field in _STRING_FIELDS:
        if op not in (":", "~") or isinstance(value, int):
            raise _invalid(f"{field} is searched with : or ~ and a quoted value.", "query")
    elif field in _NUMBER_FIELDS:
        if isinstance(value, str) and value.lstrip("-").isdigit():
            value = int(value)  # Stripe takes a number quoted or not
        if not isinstance(value, int) or op == "~":
            raise _invalid(f"{field} is searched with :, >, <, >= or <= and a number.", "query")
    else:
        known = ", ".join(sorted({"metadata", *_STRING_FIELDS, *_NUMBER_FIELDS}))
        raise _invalid(
            f"Field {field!r} is not supported for payment_intents search; use {known}.",
            "query",
        )
    return _Clause(match.group("negated") == "-", None, field, op, value)
