"""A PostgreSQL journal URL taken apart: what libpq gets, what may be shown, what must not.

The password never leaves this module but inside ``conninfo``: ``location`` is the URL
without it, and ``redact`` takes it out of any message a driver error carries where a
password can stand: a URL's user-info, a ``password=`` setting, a value the driver quotes
(every form of it: as written, decoded, encoded). Nowhere else: replacing every occurrence
of its text would reveal it (a password ``o`` turns "permission denied for schema" into
"permissi*** denied f***r schema").
"""

from __future__ import annotations

import re
import urllib.parse

import psycopg
from psycopg.conninfo import conninfo_to_dict

from ..errors import ConfigurationError
from . import _sql as sql

__all__ = ["Target", "secrets_of"]

_SECRET_PARAMETERS = ("password", "sslpassword")


class Target:
    """A journal URL taken apart: what libpq gets, what may be shown, what must not be."""

    def __init__(self, url: str) -> None:
        if not sql.is_postgres_url(url):
            raise ConfigurationError(
                "a PostgreSQL journal needs a postgresql:// (or postgres://) URL, e.g. "
                "postgresql://payonce@db.internal:5432/payments"
            )
        self._secrets = secrets_of(url)
        try:
            parts = urllib.parse.urlsplit(url)
        except ValueError as exc:
            raise self.invalid(str(exc)) from None
        rest = url.partition("://")[2]
        authority = re.split(r"[/?#]", rest, maxsplit=1)[0]
        if authority.rpartition("@")[0] != rest.rpartition("@")[0]:
            raise self.ambiguous()
        # Query segments are kept as written: decoding and re-encoding them could change
        # what libpq reads (it decodes %XX only, not "+").
        self.schema: str | None = None
        passed, shown = [], []
        for segment in filter(None, parts.query.split("&")):
            raw_name, _, raw_value = segment.partition("=")
            name = urllib.parse.unquote(raw_name)
            if name == "schema":
                self.schema = urllib.parse.unquote(raw_value)
                continue
            passed.append(segment)
            if name not in _SECRET_PARAMETERS:
                shown.append(segment)
        # By hand: urlunsplit drops the "//" of a URL with no host (a unix socket in ?host=).
        self.conninfo = f"{parts.scheme}://{parts.netloc}{parts.path}" + query_string(passed)
        try:
            self.parameters = conninfo_to_dict(self.conninfo)
        except psycopg.Error as exc:
            raise self.invalid(str(exc)) from None
        # Unless the query overrides them, libpq must read the user and password Python did.
        overridden = {urllib.parse.unquote(p.partition("=")[0]) for p in passed}
        user = urllib.parse.unquote(parts.username) if parts.username else None
        password = urllib.parse.unquote(parts.password) if parts.password is not None else None
        if ("user" not in overridden and user != self.parameters.get("user")) or (
            "password" not in overridden
            and password is not None
            and password != self.parameters.get("password")
        ):
            raise self.ambiguous()
        self._secrets = sorted(
            {*self._secrets, *secret_forms(str(self.parameters.get("password") or ""))},
            key=len,
            reverse=True,
        )
        hosts = parts.netloc.rpartition("@")[2]
        shown_user = urllib.parse.quote(user, safe="") + "@" if user else ""
        self._shown = f"{parts.scheme}://{shown_user}{hosts}{parts.path}"
        self._shown_query = shown

    def refuse_standbys(self) -> None:
        """Refuse a writer's URL that may connect it to a standby, where every write fails.

        With several hosts (``postgresql://h1:5432,h2:5432/db``, or ``?host=h1,h2``) libpq
        takes the first that accepts a connection, which after a failover can be the old
        primary come back as a standby, or a standby before its promotion: only
        ``target_session_attrs=read-write`` (or ``primary``) makes it pass over them.
        """
        hosts = _listed(self.parameters.get("host")) or _listed(self.parameters.get("hostaddr"))
        count = max(1, len(hosts))
        for name in ("port", "hostaddr"):
            given = _listed(self.parameters.get(name))
            if len(given) > 1 and len(given) != count:
                raise self.invalid(
                    f"it names {count} host(s) but {len(given)} {name} values: give one "
                    f"{name} for all of them, or one per host, in the same order"
                )
            if len(given) > 1 and "" in given and any(given):
                # libpq would take the default port (5432) for a host written without one.
                raise self.invalid(
                    f"it gives a {name} for some of its {count} hosts but not for the others: "
                    f"give one {name} for all of them, or one per host, in the same order"
                )
        ports = _listed(self.parameters.get("port"))
        if len(ports) == len(hosts) > 1:
            hosts = [f"{h}:{p}" if p else h for h, p in zip(hosts, ports, strict=True)]
        elif len(ports) == 1 and len(hosts) > 1:
            hosts = [f"{host}:{ports[0]}" for host in hosts]
        attrs = str(self.parameters.get("target_session_attrs") or "any")
        if attrs in ("read-only", "standby", "prefer-standby"):
            raise ConfigurationError(
                f"the PostgreSQL journal URL asks for target_session_attrs={attrs}, a "
                "standby, where payonce cannot write its journal: use read-write (or "
                "primary), or open the journal with read_only=True to read it there"
            )
        if count > 1 and attrs not in ("read-write", "primary"):
            raise ConfigurationError(
                f"the PostgreSQL journal URL names {count} hosts "
                f"({', '.join(hosts)}) without target_session_attrs=read-write: libpq "
                "would connect to the first that answers, which after a failover can be a "
                "standby where no write succeeds. Add ?target_session_attrs=read-write "
                "(or primary) so that payonce always writes to the primary"
            )

    def ambiguous(self) -> ConfigurationError:
        # Python and libpq would read another user or password out of it, and what is
        # shown as the location could then hold (part of) the password.
        return ConfigurationError(
            "the PostgreSQL journal URL's user name or password holds a character that "
            "must be percent-encoded (/ ? # @ : as %2F %3F %23 %40 %3A)"
        )

    def location(self, schema: str | None) -> str:
        """The URL without its password, naming the schema the journal really uses."""
        schema_segment = [f"schema={schema}"] if schema is not None else []
        return self._shown + query_string([*self._shown_query, *schema_segment])

    def invalid(self, why: str) -> ConfigurationError:
        return ConfigurationError(f"the PostgreSQL journal URL is not valid: {self.redact(why)}")

    def redact(self, text: str) -> str:
        text = _URL_PASSWORD.sub(r"\1***@", text)
        text = _PASSWORD_SETTING.sub(r"\1***", text)
        for secret in self._secrets:
            for quote in ('"', "'"):
                text = text.replace(f"{quote}{secret}{quote}", f"{quote}***{quote}")
        return text


# scheme://user:PASSWORD@ (a password holding "@" unencoded is refused as ambiguous).
_URL_PASSWORD = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*://[^\s:/?#@]*:)[^\s@]*@")
# password=VALUE, sslpassword = 'VALUE' (a conninfo string, a URL's query).
_PASSWORD_SETTING = re.compile(
    r"((?<![A-Za-z0-9_])(?:ssl)?password\s*=\s*)('(?:[^'\\]|\\.)*'|[^\s&#]*)", re.IGNORECASE
)


def secrets_of(url: str) -> list[str]:
    """The password, as written and decoded, even from a URL too broken to parse.

    Missing one form of the password would let a quoted value through, so the user-info is
    cut both at the authority's end and at the URL's last "@".
    """
    found = []
    rest = url.partition("://")[2]
    authority = re.split(r"[/?#]", rest, maxsplit=1)[0]
    for userinfo in (authority.rpartition("@")[0], rest.rpartition("@")[0]):
        if ":" in userinfo:
            found.append(userinfo.partition(":")[2])
    for match in re.finditer(r"(?:^|[?&])(?:ssl)?password=([^&#]*)", url.partition("?")[2]):
        found.append(match.group(1))
    return sorted(
        {form for secret in found for form in secret_forms(secret)}, key=len, reverse=True
    )


def _listed(value: object) -> list[str]:
    """A libpq comma-separated list (hosts, ports), empty when it is not given."""
    return str(value).split(",") if value else []


def query_string(segments: list[str]) -> str:
    return "?" + "&".join(segments) if segments else ""


def secret_forms(secret: str) -> set[str]:
    """A secret as it may appear in a message: as written, decoded, or encoded."""
    forms = {secret, urllib.parse.unquote(secret), urllib.parse.quote(secret, safe="")}
    return {form for form in forms if form}
