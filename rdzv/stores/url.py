"""Store URLs: splitting ``scheme://rest`` and redacting passwords for messages.

A store endpoint is a URL whose scheme picks the backend (``memory://job1``,
``sqlite:///var/run/job.db``, later ``redis://host:6379/0`` ...). This module only
knows the generic shape; each backend parses its own ``rest``.

Passwords never appear in messages. What counts as a password is decided
conservatively (:func:`secret_span`): everything from the first ``:`` of the authority
to the **last** ``@`` of the URL, so a password that holds a raw ``@``, ``/``, ``?`` or
``#`` (which should have been percent-encoded) is hidden whole, never in part. Every
message built from a URL quotes it through :func:`redact`, and quotes parts of it only
where they lie after that span.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from urllib.parse import parse_qsl

# RFC 3986: scheme = ALPHA *( ALPHA / DIGIT / "+" / "-" / "." )
_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*")

MASK = "***"
"""What a password is replaced with in messages."""


class StoreUrlError(ValueError):
    """A store URL is malformed or names an unknown scheme."""


def is_valid_scheme(scheme: str) -> bool:
    return bool(_SCHEME.fullmatch(scheme))


def secret_span(url: str) -> tuple[int, int] | None:
    """Where ``url`` may hold a password: ``(start, end)`` of the text between the first
    ``:`` of its authority (after ``scheme://``, before any ``/``) and its last ``@``;
    None when it has no such part (no ``@`` after such a ``:``).

    Taking the *last* ``@`` over-covers a URL whose query or path holds an ``@`` (then
    more than the password is hidden), but never leaves part of a password visible.
    """
    sep = url.find("://")
    start = sep + 3 if sep >= 0 and is_valid_scheme(url[:sep]) else 0
    slash = url.find("/", start)
    authority = url[start:] if slash < 0 else url[start:slash]
    colon = authority.find(":")
    at = url.rfind("@")
    if colon < 0 or at < start + colon:
        return None
    return start + colon + 1, at


def redact(url: str) -> str:
    """``url`` with anything that may be a password (see :func:`secret_span`) replaced
    by ``***``."""
    span = secret_span(url)
    if span is None:
        return url
    return url[: span[0]] + MASK + url[span[1] :]


def has_userinfo(url: str) -> bool:
    """Whether ``url`` has a ``user:password@`` part (as :func:`secret_span` sees it)."""
    return secret_span(url) is not None


def check_userinfo(url: str) -> None:
    """Raise :class:`StoreUrlError` when ``url``'s ``user:password@`` part would be read
    differently by a URL parser than it reads to a person: a raw ``/``, ``?`` or ``#``
    before the last ``@`` (in a password, or an ``@`` written raw after the host)."""
    span = secret_span(url)
    if span is None:
        return
    if any(c in url[span[0] : span[1]] for c in "/?#"):
        raise StoreUrlError(
            f"store URL {redact(url)!r} has a '/', '?' or '#' between the first ':' of "
            "its user:password@ part and its last '@', so its password and host cannot be "
            f"told apart (all between them is shown as {MASK}); percent-encode '@', '/', "
            "'?', '#' and ':' inside a user name or password (%40, %2F, %3F, %23, %3A), "
            "and an '@' after the host (%40)"
        )


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
        raise StoreUrlError(
            f"store URL {redact(url)!r} has an invalid scheme {redact(scheme)!r} (letters, "
            "digits, '+', '-' or '.', starting with a letter)"
        )
    return scheme.lower(), rest


def split_query(
    url: str, allowed: Sequence[str], *, no_userinfo: str | None = None
) -> tuple[str, dict[str, str]]:
    """Split the part of ``url`` after ``scheme://`` into the part before ``?`` and the
    query's parameters, each named in ``allowed``.

    ``url``'s ``user:password@`` part is looked at once, before anything else: with
    ``no_userinfo`` (the end of the message: what does not take one, and what to write
    instead) any such part is refused; without it, one a URL parser would read other than
    a person does is (see :func:`check_userinfo`). A fragment (``#...``), a parameter
    not in ``allowed`` (any parameter when ``allowed`` is empty), a parameter given
    twice, or one without ``=`` is an error. Messages quote the URL redacted, and query
    text only when it lies after the password.
    """
    shown = redact(url)
    scheme, _, rest = url.partition("://")
    scheme = scheme.lower()
    if no_userinfo is None:
        check_userinfo(url)
    elif has_userinfo(url):
        raise StoreUrlError(
            f"{scheme} URL {shown!r} has a user:password@ part, which {no_userinfo}"
        )
    if "#" in rest:
        raise StoreUrlError(
            f"store URLs take no fragment ('#...'), got {shown!r}; percent-encode a '#' "
            "inside a name or password as %23"
        )
    path, _, query = rest.partition("?")
    params: dict[str, str] = {}
    if query:
        try:
            pairs = parse_qsl(query, keep_blank_values=True, strict_parsing=True)
        except ValueError as exc:
            raise StoreUrlError(
                f"malformed query in {shown!r} ({exc}); write it as ?name=value&name=value"
            ) from None
        for name, value in pairs:
            if name in params:
                raise StoreUrlError(
                    f"query parameter {name!r} is given twice in {shown!r}; give it once"
                )
            params[name] = value
    unknown = sorted(set(params) - set(allowed))
    if unknown and not allowed:
        raise StoreUrlError(f"{scheme}:// URLs take no query parameters, got {unknown}")
    if unknown:
        raise StoreUrlError(
            f"unknown query parameter(s) {unknown} in {shown!r}; supported: {sorted(allowed)}"
        )
    return path, params
