"""ingress-nginx upstream-hash-by: nginx variables filled in, then the resty.chash ring."""

from __future__ import annotations

from kproxy.modes.userspace.http.chash import RestyChash
from kproxy.modes.userspace.http.hashby import HashByRequest, HashByTemplate, parse_complex_value

NODES = ("10.0.0.1:80", "10.0.0.2:80", "10.0.0.3:80")
REQ = HashByRequest(request_uri="/a/b?user=42&x=1", remote_addr="192.0.2.9", host="shop.example.com",
                    headers=(("X-User-Id", "alice"), ("Cookie", "sid=abc; other=1")))


def test_complex_value_splits_variables_braces_and_escapes() -> None:
    """``$var`` and ``${var}`` are variables; ``\\$var`` and other text stay literal."""
    assert parse_complex_value("$request_uri-${remote_addr}\\$host") == (
        ("request_uri", True), ("-", False), ("remote_addr", True), ("\\$host", False))


def test_each_variable_kind_reads_the_request() -> None:
    """request_uri, remote_addr, http_*, cookie_* and arg_* as nginx defines them."""
    nodes = list(NODES)
    assert HashByTemplate("$request_uri", nodes).key(REQ) == "/a/b?user=42&x=1"
    assert HashByTemplate("$remote_addr", nodes).key(REQ) == "192.0.2.9"
    assert HashByTemplate("$http_x_user_id", nodes).key(REQ) == "alice"
    assert HashByTemplate("$cookie_sid", nodes).key(REQ) == "abc"
    assert HashByTemplate("$arg_user:$host", nodes).key(REQ) == "42:shop.example.com"
    assert HashByTemplate("$http_missing|x", nodes).key(REQ) == "|x"


def test_hash_by_uses_the_same_chash_ring_as_balanced_affinity() -> None:
    """The node is resty.chash's find of the filled-in key."""
    t = HashByTemplate("$request_uri", list(NODES))
    assert t.find(REQ) == RestyChash(dict.fromkeys(NODES, 1)).find("/a/b?user=42&x=1")
