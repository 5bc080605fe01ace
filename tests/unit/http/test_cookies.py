"""Cookies as ingress-nginx parses and bakes them: lua-resty-cookie and nginx cookie_time."""

from __future__ import annotations

import calendar

from hypothesis import given
from hypothesis import strategies as st

from kproxy.modes.userspace.http.cookies import (
    SetCookie,
    bake_set_cookie,
    cookie_time,
    parse_cookie_header,
    same_site_none_compatible,
)


def test_cookie_time_uses_a_two_digit_year_up_to_2037() -> None:
    """nginx's cookie_time writes ``Sun, 12-Feb-17 14:11:12 GMT`` (the lua-resty-cookie README date)."""
    assert cookie_time(calendar.timegm((2017, 2, 12, 14, 11, 12))) == "Sun, 12-Feb-17 14:11:12 GMT"
    assert cookie_time(calendar.timegm((2037, 1, 5, 0, 0, 9))) == "Mon, 05-Jan-37 00:00:09 GMT"


def test_cookie_time_uses_four_digits_after_2037() -> None:
    """Past 2037 the year is written in full (Netscape 3 misread two-digit years above 37)."""
    assert cookie_time(calendar.timegm((2038, 3, 1, 1, 2, 3))) == "Mon, 01-Mar-2038 01:02:03 GMT"


def test_bake_orders_attributes_as_lua_resty_cookie() -> None:
    """Expires, Max-Age, Domain, Path, Secure, HttpOnly, SameSite, in that order."""
    baked = bake_set_cookie(SetCookie(name="route", value="k|b", expires="Sun, 12-Feb-17 14:11:12 GMT",
                                      max_age=60, domain="example.com", path="/app", secure=True,
                                      httponly=True, samesite="Lax"))
    assert baked == ("route=k|b; Expires=Sun, 12-Feb-17 14:11:12 GMT; Max-Age=60; Domain=example.com; "
                     "Path=/app; Secure; HttpOnly; SameSite=Lax")


def test_bake_drops_a_samesite_that_is_not_exactly_strict_lax_or_none() -> None:
    """``lax`` (lower case) is not a value lua-resty-cookie keeps."""
    assert bake_set_cookie(SetCookie(name="a", value="b", httponly=True, samesite="lax")) == "a=b; HttpOnly"


def test_parse_cookie_header_splits_on_semicolons_and_keeps_the_last_duplicate() -> None:
    """lua-resty-cookie's get_cookie_table: blanks after ``;`` skipped, last duplicate wins."""
    assert parse_cookie_header("a=1; b=2;c=3; a=4") == {"a": "4", "b": "2", "c": "3"}


def test_parse_cookie_header_keeps_spaces_inside_values_and_ends_at_tab() -> None:
    """A space inside a value is kept; a tab ends it; quotes are not removed."""
    assert parse_cookie_header('x=a b; y="q"\tz=9') == {"x": "a b", "y": '"q"', "z": "9"}


def test_samesite_none_incompatible_user_agents() -> None:
    """Chrome 51-66 and iOS 12 / macOS 10.14 Safari reject SameSite=None (same_site.lua)."""
    assert not same_site_none_compatible("Mozilla/5.0 (X11) AppleWebKit Chrome/51.0.2704 Safari/537.36")
    assert not same_site_none_compatible("Mozilla/5.0 (iPhone; CPU iPhone OS 12_0 like Mac OS X)")
    assert not same_site_none_compatible(
        "Mozilla/5.0 (Macintosh; Intel Mac OS X 10_14_6) AppleWebKit/605 (KHTML) Version/12 Safari/605")
    assert same_site_none_compatible("Mozilla/5.0 (X11) AppleWebKit Chrome/120.0 Safari/537.36")


def _state_machine(text: str) -> dict[str, str]:
    """lua-resty-cookie's get_cookie_table, transcribed state by state (the reference)."""
    out: dict[str, str] = {}
    expect_key, expect_value, expect_sp = 1, 2, 3
    state, i, j, n = expect_sp, 0, 0, len(text)
    key: str | None = None
    value: str | None = None
    while j < n:
        c = text[j]
        if state == expect_key:
            if c == "=":
                key, state, i = text[i:j], expect_value, j + 1
        elif state == expect_value:
            if c in ";\t" or (c == " " and (j == 0 or text[j - 1] == ";")):
                value = text[i:j]
                assert key is not None
                out[key] = value
                key = value = None
                state, i = expect_sp, j + 1
        elif c not in " \t":
            state, i = expect_key, j
            j -= 1
        j += 1
    if key is not None and value is None:
        out[key] = text[i:]
    return out


@given(st.text(alphabet=st.sampled_from(list("ab=; \t\"x|1")), max_size=40))
def test_parse_cookie_header_equals_lua_resty_cookie_s_state_machine(text: str) -> None:
    """For any header text, the str.find version gives what the state machine gives."""
    assert parse_cookie_header(text) == _state_machine(text)
