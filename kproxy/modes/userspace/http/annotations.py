"""ingress-nginx annotations read the way the controller reads them (prefix ``nginx.ingress.kubernetes.io/``).

Sources: ``internal/ingress/annotations/sessionaffinity/main.go`` (cookie affinity),
``internal/ingress/annotations/parser`` (``GetBoolAnnotation`` is Go's ``strconv.ParseBool``;
a missing or empty annotation is "not set"), ``annotations/upstreamhashby``, and
``rootfs/etc/nginx/lua/balancer.lua`` ``get_implementation`` (cookie affinity wins over
``upstream-hash-by``; else round robin).

As the controller does, an invalid value is not an error: it is ignored (the default applies)
and reported in :attr:`AnnotationReading.ignored` so that the caller can log it with the
Ingress's file and name.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum

__all__ = [
    "ANNOTATION_PREFIX",
    "DEFAULT_COOKIE_NAME",
    "AffinityMode",
    "AnnotationReading",
    "CanaryBehavior",
    "CookieAffinity",
    "read_annotations",
]

ANNOTATION_PREFIX = "nginx.ingress.kubernetes.io/"
#: ``defaultAffinityCookieName`` in sessionaffinity/main.go.
DEFAULT_COOKIE_NAME = "INGRESSCOOKIE"
#: ``affinityCookieExpiresRegex``: note the unanchored alternation, kept as Go has it.
_SECONDS_RE = re.compile(r"(^0|-?[1-9]\d*$)")
_GO_TRUE = frozenset({"1", "t", "T", "TRUE", "true", "True"})
_GO_FALSE = frozenset({"0", "f", "F", "FALSE", "false", "False"})
_SAMESITE = {"none": "None", "lax": "Lax", "strict": "Strict"}


class AffinityMode(StrEnum):
    """``affinity-mode``: ``balanced`` (the default, also for an empty value) or ``persistent``."""

    BALANCED = "balanced"
    PERSISTENT = "persistent"


class CanaryBehavior(StrEnum):
    """``affinity-canary-behavior``: the canary inherits the affinity (``sticky``) or not (``legacy``)."""

    STICKY = "sticky"
    LEGACY = "legacy"


@dataclass(frozen=True, slots=True, kw_only=True)
class CookieAffinity:
    """The cookie settings of one backend (the controller's ``CookieSessionAffinity``).

    Attributes:
        name: the cookie name (``session-cookie-name``, default ``INGRESSCOOKIE``).
        mode: balanced or persistent.
        canary_behavior: sticky or legacy.
        path: ``session-cookie-path``, or None for "the matched location path".
        domain: ``session-cookie-domain`` or None.
        expires_s, max_age_s: seconds, or None when unset or invalid.
        samesite: ``None``/``Lax``/``Strict`` as given (validated case-insensitively), or None.
        conditional_samesite_none: drop ``SameSite=None`` for incompatible user agents.
        secure: True forces ``Secure``; None (false or unset: ``omitempty`` makes them nil in
            Lua) means "Secure on HTTPS requests".
        change_on_failure: a retry within a request picks a new node and a new cookie.
    """

    name: str = DEFAULT_COOKIE_NAME
    mode: AffinityMode = AffinityMode.BALANCED
    canary_behavior: CanaryBehavior = CanaryBehavior.STICKY
    path: str | None = None
    domain: str | None = None
    expires_s: int | None = None
    max_age_s: int | None = None
    samesite: str | None = None
    conditional_samesite_none: bool = False
    secure: bool | None = None
    change_on_failure: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class AnnotationReading:
    """What an Ingress's annotations ask of its backends.

    Attributes:
        affinity: the cookie affinity, or None without ``affinity: cookie``.
        upstream_hash_by: the ``upstream-hash-by`` text (nginx variables), or None.
        ignored: ``(annotation, value, why)`` for each value the controller would ignore.
    """

    affinity: CookieAffinity | None = None
    upstream_hash_by: str | None = None
    ignored: tuple[tuple[str, str, str], ...] = field(default=())


def _go_bool(value: str) -> bool | None:
    if value in _GO_TRUE:
        return True
    if value in _GO_FALSE:
        return False
    return None


def _seconds(value: str) -> int | None:
    """Go's regex first, then Lua's ``tonumber`` (a match such as ``x12`` is no number there)."""
    if not _SECONDS_RE.search(value):
        return None
    try:
        return int(value)
    except ValueError:
        return None


def read_annotations(annotations: Mapping[str, str]) -> AnnotationReading:
    """Read the affinity and hashing annotations of one Ingress.

    Args:
        annotations: the Ingress's ``metadata.annotations``.
    """
    ignored: list[tuple[str, str, str]] = []

    def get(short: str) -> str | None:
        value = annotations.get(ANNOTATION_PREFIX + short)
        return value if value else None

    def get_bool(short: str) -> bool | None:
        value = get(short)
        if value is None:
            return None
        parsed = _go_bool(value)
        if parsed is None:
            ignored.append((ANNOTATION_PREFIX + short, value, "not a Go bool (true, false, 1, 0, t, f)"))
        return parsed

    def get_seconds(short: str) -> int | None:
        value = get(short)
        if value is None:
            return None
        parsed = _seconds(value)
        if parsed is None:
            ignored.append((ANNOTATION_PREFIX + short, value, "not a number of seconds"))
        return parsed

    hash_by = get("upstream-hash-by")
    affinity: CookieAffinity | None = None
    kind = get("affinity")
    if kind is not None and kind != "cookie":
        ignored.append((ANNOTATION_PREFIX + "affinity", kind, "the only affinity type is cookie"))
    if kind == "cookie":
        mode_text = get("affinity-mode") or ""
        canary_text = get("affinity-canary-behavior") or ""
        samesite_text = get("session-cookie-samesite")
        samesite = None
        if samesite_text is not None:
            if samesite_text.lower() in _SAMESITE:
                samesite = samesite_text
            else:
                ignored.append((ANNOTATION_PREFIX + "session-cookie-samesite", samesite_text,
                                "SameSite must be None, Lax or Strict"))
        affinity = CookieAffinity(
            name=get("session-cookie-name") or DEFAULT_COOKIE_NAME,
            mode=AffinityMode.PERSISTENT if mode_text == "persistent" else AffinityMode.BALANCED,
            canary_behavior=CanaryBehavior.LEGACY if canary_text == "legacy" else CanaryBehavior.STICKY,
            path=get("session-cookie-path"),
            domain=get("session-cookie-domain"),
            expires_s=get_seconds("session-cookie-expires"),
            max_age_s=get_seconds("session-cookie-max-age"),
            samesite=samesite,
            conditional_samesite_none=bool(get_bool("session-cookie-conditional-samesite-none")),
            secure=True if get_bool("session-cookie-secure") else None,
            change_on_failure=bool(get_bool("session-cookie-change-on-failure")),
        )
    return AnnotationReading(affinity=affinity, upstream_hash_by=hash_by, ignored=tuple(ignored))
