"""Envoy's request hash policies, generated cookie, ring hash and Maglev, against Envoy's own vectors."""

from __future__ import annotations

import random

import pytest
import xxhash
from hypothesis import given
from hypothesis import strategies as st

from kproxy.errors import InvalidArgument
from kproxy.modes.userspace.http.envoy_hash import (
    HashPolicy,
    HashPolicyKind,
    HashRequest,
    generated_cookie_value,
    request_hash,
    rotl64,
)
from kproxy.modes.userspace.http.envoy_lb import Maglev, RingHash

HOSTS = [f"127.0.0.1:{p}" for p in range(90, 96)]


def _req(headers=(), path="/", remote=("10.0.0.7", 40000), local=("127.0.0.1", 8080)) -> HashRequest:
    return HashRequest(headers=tuple(headers), path=path, remote=remote, local=local)


def test_maglev_table_of_envoy_maglev_lb_test_basic() -> None:
    """Six hosts, M = 7: Envoy's test expects :92 :94 :90 :91 :95 :90 :93."""
    assert [k[-2:] for k in Maglev(HOSTS, table_size=7).table] == ["92", "94", "90", "91", "95", "90", "93"]


def test_maglev_weighted_table_of_envoy_maglev_lb_test() -> None:
    """Weights 1 and 2, M = 17, as in maglev_lb_test.cc."""
    table = Maglev({"127.0.0.1:90": 1, "127.0.0.1:91": 2}, table_size=17).table
    assert [int(k.endswith("91")) for k in table] == [1, 0, 0, 1, 0, 1, 1, 0, 1, 1, 1, 1, 1, 0, 1, 0, 1]


def test_maglev_weights_one_to_two_give_envoy_s_documented_counts() -> None:
    """The docs' example: weights 1:2 and M = 65537 give 21846 : 43691 entries."""
    table = Maglev({"a:1": 1, "b:1": 2}).table
    assert (table.count("a:1"), table.count("b:1")) == (21846, 43691)


def test_maglev_refuses_a_table_size_that_is_not_prime() -> None:
    """Envoy: "The table size of maglev must be prime number"."""
    with pytest.raises(InvalidArgument, match="prime"):
        Maglev(HOSTS, table_size=1000)


def test_maglev_retry_xors_the_hash() -> None:
    """attempt > 0 looks up ``h ^ (2**64 - attempt)``."""
    m = Maglev(HOSTS, table_size=7)
    assert m.choose(5, attempt=1) == m.table[(5 ^ (2**64 - 1)) % 7]


def test_ring_hash_basic_of_envoy_ring_hash_lb_test() -> None:
    """Six hosts, min ring 12: two points each at XXH64("127.0.0.1:9x_i"), Envoy's expected ring."""
    ring = RingHash(HOSTS, min_ring_size=12)
    assert [(h, k[-2:]) for h, k in ring.points()][:4] == [
        (833437586790550860, "94"), (928266305478181108, "92"), (1033482794131418490, "90"),
        (3551244743356806947, "95")]
    assert len(ring) == 12
    assert ring.choose(0) == "127.0.0.1:94"
    assert ring.choose(2**64 - 1) == "127.0.0.1:94"
    assert ring.choose(3551244743356806947) == "127.0.0.1:95"
    assert ring.choose(3551244743356806948) == "127.0.0.1:93"


def test_ring_hash_points_per_host_are_ceil_of_min_ring_over_n() -> None:
    """1024 points for one host, 342 each for three, 205 each for five."""
    assert len(RingHash(HOSTS[:1])) == 1024
    assert len(RingHash(HOSTS[:3])) == 3 * 342
    assert len(RingHash(HOSTS[:5])) == 5 * 205


def test_ring_hash_refuses_min_above_max() -> None:
    """minimum_ring_size > maximum_ring_size is Envoy's config error."""
    with pytest.raises(InvalidArgument):
        RingHash(HOSTS, min_ring_size=10, max_ring_size=5)


def _moved(before, after, keys: int) -> float:
    rng = random.Random(7)
    hashes = [rng.getrandbits(64) for _ in range(keys)]
    return sum(before.choose(h) != after.choose(h) for h in hashes) / keys


@pytest.mark.parametrize("build", [lambda h: Maglev(h, table_size=65537), lambda h: RingHash(h)],
                         ids=["maglev", "ring_hash"])
def test_removing_one_of_n_hosts_moves_about_one_nth_of_keys(build) -> None:
    """With ten hosts, dropping one moves about a tenth of the keys (not much more)."""
    hosts = [f"10.0.0.{i}:80" for i in range(1, 11)]
    moved = _moved(build(hosts), build(hosts[:-1]), 20000)
    assert 0.07 < moved < 0.16


@given(st.permutations(HOSTS))
def test_maglev_table_does_not_depend_on_host_order(order: list[str]) -> None:
    """Envoy sorts the hosts by key before filling the table (envoy#20703)."""
    assert Maglev(order, table_size=251).table == Maglev(HOSTS, table_size=251).table


@given(st.permutations(HOSTS), st.integers(0, 2**64 - 1))
def test_ring_hash_choice_does_not_depend_on_host_order(order: list[str], h: int) -> None:
    """Equal-weight hosts get the same points in any host-set order."""
    assert RingHash(order, min_ring_size=64).choose(h) == RingHash(HOSTS, min_ring_size=64).choose(h)


def _ketama(points: list[tuple[int, str]], h: int) -> str:
    """Envoy's Ring::chooseHost, the signed binary search ported from libketama, literally."""
    lowp, highp = 0, len(points)
    while True:
        midp = (lowp + highp) // 2
        if midp == len(points):
            return points[0][1]
        midval = points[midp][0]
        midval1 = 0 if midp == 0 else points[midp - 1][0]
        if midval1 < h <= midval:
            return points[midp][1]
        if midval < h:
            lowp = midp + 1
        else:
            highp = midp - 1
        if lowp > highp:
            return points[0][1]


@given(st.sets(st.builds(lambda a, p: f"10.9.{a}.1:{p}", st.integers(0, 255), st.integers(1, 65535)),
               min_size=1, max_size=5), st.integers(0, 2**64 - 1))
def test_ring_hash_choice_equals_the_ketama_reference(hosts: set[str], h: int) -> None:
    """For any hosts and hash, bisect picks what Envoy's ketama search picks."""
    ring = RingHash(sorted(hosts), min_ring_size=32)
    assert ring.choose(h) == _ketama(ring.points(), h)


def _paper_maglev(hosts: list[str], m: int) -> list[str]:
    """Maglev paper listing 1 for equal weights: hosts in sorted order take turns."""
    hosts = sorted(hosts)
    perm = [(xxhash.xxh64_intdigest(h.encode(), 0) % m, xxhash.xxh64_intdigest(h.encode(), 1) % (m - 1) + 1)
            for h in hosts]
    nxt = [0] * len(hosts)
    entry: list[str | None] = [None] * m
    n = 0
    while True:
        for i in range(len(hosts)):
            off, skip = perm[i]
            c = (off + nxt[i] * skip) % m
            while entry[c] is not None:
                nxt[i] += 1
                c = (off + nxt[i] * skip) % m
            entry[c] = hosts[i]
            nxt[i] += 1
            n += 1
            if n == m:
                return [e for e in entry if e is not None]


@given(st.sets(st.builds(lambda a, p: f"10.8.{a}.1:{p}", st.integers(0, 255), st.integers(1, 65535)),
               min_size=1, max_size=8))
def test_maglev_equal_weights_equals_the_paper_reference(hosts: set[str]) -> None:
    """With equal weights Envoy's table is the paper's populate() over sorted hosts."""
    assert list(Maglev(list(hosts), table_size=103).table) == _paper_maglev(list(hosts), 103)


def test_header_policy_hashes_sorted_values_as_one_stream() -> None:
    """One value: XXH64(value); several: XXH64 of the sorted values concatenated."""
    p = [HashPolicy(kind=HashPolicyKind.HEADER, name="X-User")]
    assert request_hash(p, _req([("x-user", "alice")])).hash == xxhash.xxh64_intdigest(b"alice")
    two = request_hash(p, _req([("X-User", "b"), ("x-user", "a")])).hash
    assert two == xxhash.xxh64_intdigest(b"ab")
    assert request_hash(p, _req()).hash is None


def test_cookie_policy_hashes_the_value_without_quotes() -> None:
    """Envoy strips surrounding double quotes and hashes the first cookie of that name."""
    p = [HashPolicy(kind=HashPolicyKind.COOKIE, name="user")]
    r = request_hash(p, _req([("cookie", 'a=1; user="1d3bff24aaafca2c"; user=zz')]))
    assert r.hash == xxhash.xxh64_intdigest(b"1d3bff24aaafca2c") and r.set_cookies == ()


def test_cookie_policy_without_ttl_and_without_cookie_gives_no_hash() -> None:
    """No cookie and no ttl: no hash, so Envoy picks at random."""
    assert request_hash([HashPolicy(kind=HashPolicyKind.COOKIE, name="user")], _req()).hash is None


def test_cookie_policy_with_ttl_generates_envoy_s_cookie() -> None:
    """The value is hex XXH64(remote + local address) and the request is hashed with it."""
    p = [HashPolicy(kind=HashPolicyKind.COOKIE, name="user", path="/", ttl_s=60)]
    r = request_hash(p, _req(remote=("10.0.0.7", 40000), local=("127.0.0.1", 8080)))
    value = f"{xxhash.xxh64_intdigest(b'10.0.0.7:40000127.0.0.1:8080'):016x}"
    assert value == generated_cookie_value(("10.0.0.7", 40000), ("127.0.0.1", 8080))
    assert r.set_cookies == (f'user="{value}"; Max-Age=60; Path=/; HttpOnly',)
    assert r.hash == xxhash.xxh64_intdigest(value.encode())


def test_zero_ttl_generates_a_session_cookie() -> None:
    """ttl 0 leaves Max-Age out (Istio documents it as a session cookie)."""
    p = [HashPolicy(kind=HashPolicyKind.COOKIE, name="s", ttl_s=0)]
    (cookie,) = request_hash(p, _req(remote=("::1", 5), local=("::1", 80))).set_cookies
    assert cookie.endswith("; HttpOnly") and "Max-Age" not in cookie and "Path" not in cookie
    assert cookie == f's="{xxhash.xxh64_intdigest(b"[::1]:5[::1]:80"):016x}"; HttpOnly'


def test_source_ip_and_query_parameter_policies() -> None:
    """Source IP hashes the address without port; query parameter the first raw value."""
    ip = request_hash([HashPolicy(kind=HashPolicyKind.SOURCE_IP)], _req(remote=("10.1.2.3", 9)))
    assert ip.hash == xxhash.xxh64_intdigest(b"10.1.2.3")
    q = [HashPolicy(kind=HashPolicyKind.QUERY_PARAMETER, name="u")]
    assert request_hash(q, _req(path="/p?x=1&u=a%20b&u=c")).hash == xxhash.xxh64_intdigest(b"a%20b")
    assert request_hash(q, _req(path="/p?x=1")).hash is None


def test_several_policies_combine_with_rotate_left_and_xor() -> None:
    """hash = rotl64(previous, 1) XOR new; a terminal policy stops once a hash exists."""
    h1, h2 = xxhash.xxh64_intdigest(b"alice"), xxhash.xxh64_intdigest(b"10.0.0.7")
    policies = [HashPolicy(kind=HashPolicyKind.HEADER, name="x-user"),
                HashPolicy(kind=HashPolicyKind.SOURCE_IP)]
    assert request_hash(policies, _req([("x-user", "alice")])).hash == rotl64(h1) ^ h2
    terminal = [HashPolicy(kind=HashPolicyKind.HEADER, name="x-user", terminal=True), policies[1]]
    assert request_hash(terminal, _req([("x-user", "alice")])).hash == h1
    assert request_hash(policies, _req()).hash == h2
