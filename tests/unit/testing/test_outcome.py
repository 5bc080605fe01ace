# ruff: noqa: E501  (cluster literals and test names are kept whole to stay readable)
"""Outcomes: frozen endpoint shares and the agreement rule, exact and sampled."""

from __future__ import annotations

from fractions import Fraction

import pytest

from kproxy.errors import InvalidArgument
from kproxy.testing import EndpointShares, Outcome, Verdict
from kproxy.testing.outcome import PROBABILITY_TOLERANCE, probabilities_agree, sampling_bound


def test_endpoint_shares_are_a_frozen_sorted_hashable_mapping() -> None:
    """Shares iterate sorted by address, hash, and compare as a mapping."""
    shares = EndpointShares({"10.0.0.2:80": Fraction(1, 2), "10.0.0.1:80": Fraction(1, 2)})
    assert list(shares) == ["10.0.0.1:80", "10.0.0.2:80"]
    assert hash(shares) == hash(EndpointShares(dict(shares)))
    assert shares == {"10.0.0.1:80": Fraction(1, 2), "10.0.0.2:80": Fraction(1, 2)}


def test_a_probability_outside_zero_to_one_is_refused() -> None:
    """A share of 2 raises InvalidArgument naming the endpoint."""
    with pytest.raises(InvalidArgument, match=r"10\.0\.0\.1:80"):
        EndpointShares({"10.0.0.1:80": 2.0})


def test_exact_and_enumerated_probabilities_agree_within_the_printed_precision() -> None:
    """1/3 agrees with kube-proxy's 0.33333333349 and not with 0.34."""
    exact = Outcome(mode="a", verdict=Verdict.ACCEPT, endpoints={"x:1": Fraction(1, 3), "y:1": Fraction(2, 3)})
    close = Outcome(mode="b", verdict=Verdict.ACCEPT, endpoints={"x:1": 0.33333333349, "y:1": 0.66666666651})
    far = Outcome(mode="c", verdict=Verdict.ACCEPT, endpoints={"x:1": 0.34, "y:1": 0.66})
    assert probabilities_agree(exact, close) and not probabilities_agree(exact, far)
    assert PROBABILITY_TOLERANCE < 1e-6


def test_sampled_shares_agree_within_the_stated_bound() -> None:
    """A sampled share within sampling_bound of the exact one agrees; one beyond it does not."""
    exact = Outcome(mode="a", verdict=Verdict.ACCEPT, endpoints={"x:1": 0.5, "y:1": 0.5})
    bound = sampling_bound(0.5, 400)
    inside = Outcome(mode="b", verdict=Verdict.ACCEPT, samples=400,
                     endpoints={"x:1": 0.5 + bound * 0.9, "y:1": 0.5 - bound * 0.9})
    outside = Outcome(mode="b", verdict=Verdict.ACCEPT, samples=400,
                      endpoints={"x:1": 0.5 + bound * 1.1, "y:1": 0.5 - bound * 1.1})
    assert probabilities_agree(exact, inside) and not probabilities_agree(exact, outside)


def test_different_endpoint_sets_never_agree() -> None:
    """An endpoint reached by one mode only is a disagreement whatever its share."""
    a = Outcome(mode="a", verdict=Verdict.ACCEPT, endpoints={"x:1": 1.0})
    b = Outcome(mode="b", verdict=Verdict.ACCEPT, samples=10, endpoints={"x:1": 0.9, "y:1": 0.1})
    assert not probabilities_agree(a, b)
