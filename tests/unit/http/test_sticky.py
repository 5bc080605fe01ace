"""ingress-nginx cookie affinity: cookie values, balance() per attempt, Set-Cookie for every annotation."""

from __future__ import annotations

import calendar
import hashlib
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kproxy.errors import InvalidArgument
from kproxy.modes.userspace.http.annotations import AffinityMode, CookieAffinity, read_annotations
from kproxy.modes.userspace.http.chash import RestyChash
from kproxy.modes.userspace.http.sticky import (
    StickyBalancer,
    backend_key,
    cookie_value,
    parse_cookie_value,
    set_cookie_header,
    should_set_cookie,
    upstream_name,
)

NAME = upstream_name("default", "web", 80)
NODES = ("10.0.0.1:8080", "10.0.0.2:8080", "10.0.0.3:8080")
BALANCED = CookieAffinity()
PERSISTENT = CookieAffinity(mode=AffinityMode.PERSISTENT)
NOW = 1_700_000_000.125


def _md5(text: str) -> str:
    return hashlib.md5(text.encode()).hexdigest()


def _balance(b: StickyBalancer, cookie: str | None, *, last_failed: bool = False,
             tried: frozenset[str] = frozenset(), declared: bool = True, seed: int = 1):
    return b.balance(cookie=cookie, last_failed=last_failed, tried=tried, location_declared=declared,
                     rng=random.Random(seed), now_s=NOW, worker_pid=77)


def test_upstream_name_and_backend_key_are_ingress_nginx_s() -> None:
    """The backend is ``namespace-service-port`` and its key md5(md5(name) .. name)."""
    assert NAME == "default-web-80"
    assert backend_key(NAME) == _md5(_md5("default-web-80") + "default-web-80")
    assert upstream_name("shop", "api", "http") == "shop-api-http"


def test_balanced_first_request_sets_a_random_key_with_the_backend_suffix() -> None:
    """No cookie: a new key ``<now+1>.<pid>.<1..999999>`` routed by chash, cookie key|backend_key."""
    b = StickyBalancer(name=NAME, nodes=NODES, affinity=BALANCED)
    r = _balance(b, None)
    expected_key = f"1700000001.125.77.{random.Random(1).randint(1, 999999)}"
    assert r.new_key == expected_key and r.set_cookie
    assert r.node == RestyChash(dict.fromkeys(NODES, 1)).find(expected_key)
    assert cookie_value(expected_key, NAME) == f"{expected_key}|{backend_key(NAME)}"


def test_balanced_cookie_is_followed_and_never_rewritten() -> None:
    """A request with a cookie goes where chash sends its key, and gets no new cookie."""
    b = StickyBalancer(name=NAME, nodes=NODES, affinity=BALANCED)
    value = cookie_value("1700000001.125.77.4242", NAME)
    r = _balance(b, value)
    assert r.node == b.find("1700000001.125.77.4242") and not r.set_cookie and r.new_key is None


def test_balanced_tampered_cookie_still_routes_and_is_kept() -> None:
    """Any key maps somewhere in balanced mode, so a tampered value is not replaced."""
    b = StickyBalancer(name=NAME, nodes=NODES, affinity=BALANCED)
    r = _balance(b, "garbage-from-a-user")
    assert r.node in NODES and not r.set_cookie


def test_balanced_key_moves_silently_when_its_pod_goes() -> None:
    """When the pinned node leaves, the same key remaps to a ring neighbour without a new cookie."""
    key = next(f"k{i}" for i in range(1000)
               if StickyBalancer(name=NAME, nodes=NODES, affinity=BALANCED).find(f"k{i}") == NODES[0])
    after = StickyBalancer(name=NAME, nodes=NODES[1:], affinity=BALANCED)
    r = _balance(after, cookie_value(key, NAME))
    assert r.node in NODES[1:] and not r.set_cookie


def test_persistent_key_is_md5_of_the_name_and_the_endpoint() -> None:
    """Persistent mode: the key is md5(backend name .. "ip:port"), an exact map."""
    b = StickyBalancer(name=NAME, nodes=NODES, affinity=PERSISTENT)
    r = _balance(b, None)
    assert r.node is not None and r.new_key == _md5(NAME + r.node) and r.set_cookie
    again = _balance(b, cookie_value(r.new_key, NAME), seed=99)
    assert again.node == r.node and not again.set_cookie


def test_persistent_stale_or_tampered_key_picks_at_random_and_sets_a_new_cookie() -> None:
    """A key no live endpoint has finds nothing, so a random endpoint is picked with a new cookie."""
    b = StickyBalancer(name=NAME, nodes=NODES[1:], affinity=PERSISTENT)
    stale = cookie_value(_md5(NAME + NODES[0]), NAME)
    r = _balance(b, stale)
    assert r.node in NODES[1:] and r.set_cookie and r.new_key == _md5(NAME + r.node)


def test_new_pick_on_an_undeclared_location_sets_no_cookie() -> None:
    """Only the (host, path) locations of affinity Ingresses get the cookie."""
    b = StickyBalancer(name=NAME, nodes=NODES, affinity=BALANCED)
    r = _balance(b, None, declared=False)
    assert r.node in NODES and not r.set_cookie


@pytest.mark.parametrize("affinity", [BALANCED, PERSISTENT], ids=["balanced", "persistent"])
def test_retry_without_change_on_failure_returns_to_the_cookie_node(affinity: CookieAffinity) -> None:
    """change-on-failure false: a retry goes back to the pinned node, cookie unchanged."""
    b = StickyBalancer(name=NAME, nodes=NODES, affinity=affinity)
    first = _balance(b, None)
    assert first.new_key is not None
    retry = _balance(b, cookie_value(first.new_key, NAME), last_failed=True, tried=frozenset({first.node}))
    assert retry.node == first.node and not retry.set_cookie


@pytest.mark.parametrize("mode", list(AffinityMode))
def test_retry_with_change_on_failure_picks_an_untried_node_and_a_new_cookie(mode: AffinityMode) -> None:
    """change-on-failure true: the retry excludes the tried peers and sets a new cookie."""
    b = StickyBalancer(name=NAME, nodes=NODES, affinity=CookieAffinity(mode=mode, change_on_failure=True))
    first = _balance(b, None)
    assert first.new_key is not None and first.node is not None
    for seed in range(20):
        retry = _balance(b, cookie_value(first.new_key, NAME), last_failed=True,
                         tried=frozenset({first.node}), seed=seed)
        assert retry.node != first.node and retry.node in NODES and retry.set_cookie


def test_no_untried_node_left_gives_no_peer() -> None:
    """When every node was tried, pick_new_upstream finds none."""
    b = StickyBalancer(name=NAME, nodes=NODES, affinity=CookieAffinity(change_on_failure=True))
    assert _balance(b, "x", last_failed=True, tried=frozenset(NODES)).node is None


def test_balancer_without_nodes_is_refused() -> None:
    """ingress-nginx answers 503 instead of building a balancer with no endpoints."""
    with pytest.raises(InvalidArgument):
        StickyBalancer(name=NAME, nodes=(), affinity=BALANCED)


def test_cookie_value_parsing_splits_on_the_bar() -> None:
    """``key|backend`` splits in two; a legacy cookie has no backend key; empty pieces drop."""
    assert parse_cookie_value("abc|def") == ("abc", "def")
    assert parse_cookie_value("abc") == ("abc", None)
    assert parse_cookie_value("|") == (None, None)
    assert parse_cookie_value(None) == (None, None)


def test_should_set_cookie_host_wildcard_and_default_server() -> None:
    """Exact host first, then its wildcard; the default server is ``_``."""
    locs = {"shop.example.com": ["/"], "*.example.com": ["/api"], "_": ["/"]}
    assert should_set_cookie(locs, host="shop.example.com", default_server=False, location_path="/")
    assert not should_set_cookie(locs, host="shop.example.com", default_server=False, location_path="/api")
    assert should_set_cookie(locs, host="a.example.com", default_server=False, location_path="/api")
    assert should_set_cookie(locs, host="anything", default_server=True, location_path="/")
    assert not should_set_cookie(locs, host="other.org", default_server=False, location_path="/")


A = "nginx.ingress.kubernetes.io/"


def _header(annotations: dict[str, str], *, https: bool = False, ua: str = "curl/8", path: str = "/") -> str:
    affinity = read_annotations({A + "affinity": "cookie", **annotations}).affinity
    assert affinity is not None
    return set_cookie_header(affinity, value="k|b", location_path=path, https=https, user_agent=ua,
                             now_s=calendar.timegm((2030, 6, 1, 12, 0, 0)) + 0.5)


def test_default_cookie_is_a_session_cookie_on_the_location_path() -> None:
    """INGRESSCOOKIE, Path = matched location, HttpOnly always, no Expires or Max-Age."""
    assert _header({}, path="/shop") == "INGRESSCOOKIE=k|b; Path=/shop; HttpOnly"


def test_every_cookie_annotation_lands_in_the_set_cookie_header() -> None:
    """name, expires, max-age, domain, path, secure and samesite, in lua-resty-cookie's order."""
    header = _header({A + "session-cookie-name": "route", A + "session-cookie-expires": "172800",
                      A + "session-cookie-max-age": "3600", A + "session-cookie-domain": "example.com",
                      A + "session-cookie-path": "/", A + "session-cookie-secure": "true",
                      A + "session-cookie-samesite": "Strict"}, path="/ignored")
    assert header == ("route=k|b; Expires=Mon, 03-Jun-30 12:00:00 GMT; Max-Age=3600; Domain=example.com; "
                      "Path=/; Secure; HttpOnly; SameSite=Strict")


def test_secure_comes_from_https_unless_forced() -> None:
    """secure false arrives as nil in Lua, so HTTPS still makes the cookie Secure."""
    assert "Secure" in _header({}, https=True)
    assert "Secure" in _header({A + "session-cookie-secure": "false"}, https=True)
    assert "Secure" not in _header({A + "session-cookie-secure": "false"})


def test_conditional_samesite_none_drops_none_for_incompatible_agents() -> None:
    """SameSite=None is kept for modern agents and dropped for Chrome 5x under the conditional flag."""
    ann = {A + "session-cookie-samesite": "None", A + "session-cookie-conditional-samesite-none": "true"}
    assert _header(ann, ua="Chrome/120.0").endswith("; SameSite=None")
    assert "SameSite" not in _header(ann, ua="Mozilla/5.0 Chrome/55.0.1")
    assert _header({A + "session-cookie-samesite": "None"}, ua="Chrome/55.0").endswith("SameSite=None")


def test_invalid_seconds_are_ignored_as_the_controller_does() -> None:
    """Values failing Go's seconds regex give no Expires/Max-Age and are reported."""
    reading = read_annotations({A + "affinity": "cookie", A + "session-cookie-max-age": "1h",
                                A + "session-cookie-expires": "abc"})
    assert reading.affinity is not None
    assert reading.affinity.max_age_s is None and reading.affinity.expires_s is None
    assert {name for name, _, _ in reading.ignored} == {A + "session-cookie-max-age",
                                                        A + "session-cookie-expires"}


def test_affinity_mode_and_change_on_failure_annotations() -> None:
    """affinity-mode persistent, anything else balanced; change-on-failure is a Go bool."""
    r = read_annotations({A + "affinity": "cookie", A + "affinity-mode": "persistent",
                          A + "session-cookie-change-on-failure": "True",
                          A + "affinity-canary-behavior": "legacy"}).affinity
    assert r is not None and r.mode is AffinityMode.PERSISTENT and r.change_on_failure
    assert r.canary_behavior == "legacy"
    r2 = read_annotations({A + "affinity": "cookie", A + "affinity-mode": "weird"}).affinity
    assert r2 is not None and r2.mode is AffinityMode.BALANCED and not r2.change_on_failure


def test_no_affinity_without_the_cookie_type() -> None:
    """Only ``affinity: cookie`` enables sticky balancing; upstream-hash-by is read on its own."""
    r = read_annotations({A + "affinity": "ip", A + "upstream-hash-by": "$request_uri"})
    assert r.affinity is None and r.upstream_hash_by == "$request_uri"


@given(nodes=st.sets(st.builds(lambda a, p: f"10.1.{a}.9:{p}", st.integers(0, 255), st.integers(1, 65535)),
                     min_size=1, max_size=6),
       cookie=st.text(alphabet=st.characters(blacklist_characters="|;"), min_size=1, max_size=30))
def test_balanced_choice_equals_chash_of_the_cookie_key(nodes: set[str], cookie: str) -> None:
    """For any endpoints and any cookie, the node is resty.chash's find of the key before ``|``."""
    b = StickyBalancer(name=NAME, nodes=nodes, affinity=BALANCED)
    r = _balance(b, f"{cookie}|{backend_key(NAME)}")
    assert r.node == RestyChash(dict.fromkeys(nodes, 1)).find(cookie)


@given(nodes=st.sets(st.builds(lambda a, p: f"10.2.{a}.9:{p}", st.integers(0, 255), st.integers(1, 65535)),
                     min_size=1, max_size=6),
       pick=st.integers(0, 5))
def test_persistent_choice_equals_the_md5_map(nodes: set[str], pick: int) -> None:
    """For any endpoints, a persistent cookie of endpoint e routes to e."""
    target = sorted(nodes)[pick % len(nodes)]
    b = StickyBalancer(name=NAME, nodes=nodes, affinity=PERSISTENT)
    assert _balance(b, cookie_value(_md5(NAME + target), NAME)).node == target
