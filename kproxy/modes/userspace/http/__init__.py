"""The HTTP data plane (layer 7): ingress-nginx routing and cookie affinity, Envoy/Istio hashing.

Pure cores, cited in each module: :mod:`.chash` (lua-resty-balancer's CRC32 ring),
:mod:`.cookies` (lua-resty-cookie, nginx ``cookie_time``), :mod:`.annotations` and
:mod:`.sticky` (ingress-nginx's sticky balancers and ``balance()``), :mod:`.hashby`
(``upstream-hash-by``), :mod:`.envoy_hash` (Envoy's hash policies and generated cookie) and
:mod:`.envoy_lb` (Envoy's ring hash and Maglev).
"""

from kproxy.modes.userspace.http.annotations import (
    AffinityMode,
    AnnotationReading,
    CanaryBehavior,
    CookieAffinity,
    read_annotations,
)
from kproxy.modes.userspace.http.chash import RestyChash
from kproxy.modes.userspace.http.envoy_hash import HashPolicy, HashPolicyKind, HashRequest, request_hash
from kproxy.modes.userspace.http.envoy_lb import Maglev, RingHash
from kproxy.modes.userspace.http.hashby import HashByRequest, HashByTemplate
from kproxy.modes.userspace.http.sticky import StickyBalancer, backend_key, upstream_name

__all__ = [
    "AffinityMode",
    "AnnotationReading",
    "CanaryBehavior",
    "CookieAffinity",
    "HashByRequest",
    "HashByTemplate",
    "HashPolicy",
    "HashPolicyKind",
    "HashRequest",
    "Maglev",
    "RestyChash",
    "RingHash",
    "StickyBalancer",
    "backend_key",
    "read_annotations",
    "request_hash",
    "upstream_name",
]
