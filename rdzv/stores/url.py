"""Store URLs: splitting ``scheme://rest`` and redacting passwords for messages.

A store endpoint is a URL whose scheme picks the backend (``memory://job1``,
``sqlite:///var/run/job.db``, later ``redis://host:6379/0`` ...). This module only
knows the generic shape; each backend parses its own ``rest``.
"""

from __future__ import annotations

import re
from urllib.parse import parse_qsl

# RFC 3986: scheme = ALPHA *( ALPHA / DIGIT / "+" / "-" / "." )
_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*")
# user:password@ in a URL's authority; the password is replaced in messages.
_USERINFO_PASSWORD = re.compile(r"^(?P<head>[A-Za-z][A-Za-z0-9+.\-]*://[^/@:]*:)[^/@]*(?=@)")


class StoreUrlError(ValueError):
    """A store URL is malformed or names an unknown scheme."""


def is_valid_scheme(scheme: str) -> bool:
    return bool(_SCHEME.fullmatch(scheme))


def split_url(url: object) -> tuple[str, str]:
    """Split ``scheme://rest`` into ``(scheme in lower case, rest)``.

    Raises :class:`StoreUrlError` (a ``ValueError``) when ``url`` has no ``://`` or an
    invalid scheme; the caller adds the list of supported schemes to the message.
    """
    if not isinstance(url, str):
        raise StoreUrlError(f"a store URL must be a str, got {type(url).__name__}")
    if url != url.strip() or any(c in url for c in "\r\n\t"):
        raise StoreUrlError(f"store URL {redact(url)!r} contains whitespace or control characters")
    scheme, sep, rest = url.partition("://")
    if not sep:
        raise StoreUrlError(f"store URL {redact(url)!r} has no scheme (expected scheme://...)")
    if not is_valid_scheme(scheme):
        raise StoreUrlError(f"store URL {redact(url)!r} has an invalid scheme {scheme!r}")
    return scheme.lower(), rest


def split_query(rest: str) -> tuple[str, dict[str, str]]:
    """Split ``path?name=value&...`` into the path and its parameters.

    A parameter given twice, or a parameter without ``=``, is an error.
    """
    if "#" in rest:
        raise StoreUrlError(f"store URLs take no fragment ('#...'), got {rest!r}")
    path, _, query = rest.partition("?")
    params: dict[str, str] = {}
    if query:
        try:
            pairs = parse_qsl(query, keep_blank_values=True, strict_parsing=True)
        except ValueError as exc:
            raise StoreUrlError(f"malformed query {query!r}: {exc}") from None
        for name, value in pairs:
            if name in params:
                raise StoreUrlError(f"query parameter {name!r} is given twice in {query!r}")
            params[name] = value
    return path, params


def redact(url: str) -> str:
    """``url`` with any password in its ``user:password@`` part replaced by ``***``."""
    return _USERINFO_PASSWORD.sub(r"\g<head>***", url, count=1)
