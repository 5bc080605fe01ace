"""Go's parsing of a string-slice flag and of a CIDR, as kube-proxy does it, in pure functions.

kube-proxy declares list flags such as ``--nodeport-addresses`` with pflag's ``StringSliceVar``,
whose ``Set`` reads the value as one CSV record (``readAsCSV``: ``""`` is the empty list, else
``encoding/csv``'s ``Reader.Read`` with the default settings). So elements are split at commas
only: blanks are kept (``"a, b"`` gives ``" b"``), an empty element is kept (``"a,"`` gives
``["a", ""]``), a field may be double-quoted (``"a,b"`` stays one element, ``""`` inside is a
quote) and a quote inside an unquoted field is an error. Only the first line is read.

CIDRs are then checked with ``k8s.io/utils/net.ParseCIDRSloppy``, Go 1.16's ``net.ParseCIDR``
kept for compatibility (``k8s.io/utils/internal/third_party/forked/golang/net/ip.go``): IPv4
octets may have leading zeros and are read as decimal (``010.0.0.0/8`` is ``10.0.0.0/8``), the
prefix is a decimal length, and an IPv6 zone (``%eth0``) or any blank is refused. Python's
:mod:`ipaddress` differs on each of those points, hence this port.
"""

from __future__ import annotations

import ipaddress

from kproxy.errors import CsvError

__all__ = ["CsvError", "parse_cidr_sloppy", "parse_ip_sloppy", "read_csv_record"]

#: Go's ``big`` in ``net/parse.go``: ``dtoi``/``xtoi`` give up at this value.
_BIG = 0xFFFFFF
_IPV4_LEN = 4
_IPV6_LEN = 16


def read_csv_record(text: str) -> list[str]:
    """The first CSV record of ``text``, as pflag's ``readAsCSV`` returns it.

    Returns:
        The fields, blanks and empty fields kept; ``[]`` for ``""``.

    Raises:
        CsvError: a bare ``"`` in an unquoted field, an unterminated or badly closed quoted
            field, or no record at all (only line breaks).
    """
    if text == "":
        return []
    text = text.replace("\r\n", "\n")
    if text.endswith("\r"):  # Go's readLine drops a final \r at end of input
        text = text[:-1]
    pos = 0
    while pos < len(text) and text[pos] == "\n":  # empty lines are skipped
        pos += 1
    if pos >= len(text):
        raise CsvError("no record (EOF)")
    fields: list[str] = []
    while True:
        if pos < len(text) and text[pos] == '"':
            pos, field, more = _quoted_field(text, pos + 1)
        else:
            end = len(text)
            for sep in (",", "\n"):
                found = text.find(sep, pos)
                if 0 <= found < end:
                    end = found
            field = text[pos:end]
            if '"' in field:
                raise CsvError(f'bare " in non-quoted-field at column {pos + field.index(chr(34)) + 1}')
            more = end < len(text) and text[end] == ","
            pos = end + 1
        fields.append(field)
        if not more:
            return fields


def _quoted_field(text: str, pos: int) -> tuple[int, str, bool]:
    """Read a quoted field whose opening quote ends before ``pos``: (next pos, field, another follows)."""
    parts: list[str] = []
    while True:
        close = text.find('"', pos)
        if close < 0:
            raise CsvError('extraneous or missing " in quoted-field (no closing quote)')
        parts.append(text[pos:close])
        after = text[close + 1:close + 2]
        if after == '"':
            parts.append('"')
            pos = close + 2
        elif after == ",":
            return close + 2, "".join(parts), True
        elif after in ("", "\n"):
            return close + 2, "".join(parts), False
        else:
            raise CsvError(f'extraneous or missing " in quoted-field at column {close + 2}')


def _dtoi(s: str) -> tuple[int, int, bool]:
    """Go's ``dtoi``: the decimal number at the start of ``s``, digits used, ok."""
    n = i = 0
    while i < len(s) and "0" <= s[i] <= "9":
        n = n * 10 + ord(s[i]) - ord("0")
        if n >= _BIG:
            return _BIG, i, False
        i += 1
    return (n, i, i > 0)


def _xtoi(s: str) -> tuple[int, int, bool]:
    """Go's ``xtoi``: the hexadecimal number at the start of ``s``, digits used, ok."""
    n = i = 0
    while i < len(s) and s[i] in "0123456789abcdefABCDEF":
        n = n * 16 + int(s[i], 16)
        if n >= _BIG:
            return 0, i, False
        i += 1
    return (n, i, i > 0)


def _parse_ipv4(s: str) -> bytes | None:
    out = bytearray()
    for i in range(_IPV4_LEN):
        if not s:
            return None
        if i > 0:
            if s[0] != ".":
                return None
            s = s[1:]
        n, c, ok = _dtoi(s)
        if not ok or n > 0xFF:  # leading zeros allowed: the check Go 1.17 added is left out
            return None
        s = s[c:]
        out.append(n)
    return bytes(out) if not s else None


def _parse_ipv6(s: str) -> bytes | None:  # a line-by-line port of Go's parseIPv6
    ip = bytearray(_IPV6_LEN)
    ellipsis = -1
    if s.startswith("::"):
        ellipsis, s = 0, s[2:]
        if not s:
            return bytes(ip)
    i = 0
    while i < _IPV6_LEN:
        n, c, ok = _xtoi(s)
        if not ok or n > 0xFFFF:
            return None
        if c < len(s) and s[c] == ".":  # a trailing IPv4 address
            if (ellipsis < 0 and i != _IPV6_LEN - _IPV4_LEN) or i + _IPV4_LEN > _IPV6_LEN:
                return None
            ip4 = _parse_ipv4(s)
            if ip4 is None:
                return None
            ip[i:i + 4] = ip4
            s, i = "", i + _IPV4_LEN
            break
        ip[i], ip[i + 1] = n >> 8, n & 0xFF
        i += 2
        s = s[c:]
        if not s:
            break
        if s[0] != ":" or len(s) == 1:
            return None
        s = s[1:]
        if s[0] == ":":
            if ellipsis >= 0:
                return None
            ellipsis, s = i, s[1:]
            if not s:
                break
    if s:
        return None
    if i < _IPV6_LEN:
        if ellipsis < 0:
            return None
        gap = _IPV6_LEN - i
        ip[ellipsis + gap:] = ip[ellipsis:i]
        ip[ellipsis:ellipsis + gap] = bytes(gap)
    elif ellipsis >= 0:
        return None
    return bytes(ip)


def parse_ip_sloppy(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """``netutils.ParseIPSloppy``: the address, or None when Go would return nil."""
    for ch in text:
        if ch == ".":
            v4 = _parse_ipv4(text)
            return None if v4 is None else ipaddress.IPv4Address(v4)
        if ch == ":":
            v6 = _parse_ipv6(text)
            return None if v6 is None else ipaddress.IPv6Address(v6)
    return None


def parse_cidr_sloppy(text: str) -> tuple[ipaddress.IPv4Address | ipaddress.IPv6Address, int] | None:
    """``netutils.ParseCIDRSloppy``: ``(address, prefix length)``, host bits kept, or None if refused."""
    address, slash, mask = text.partition("/")
    if not slash:
        return None
    ip: ipaddress.IPv4Address | ipaddress.IPv6Address
    v4 = _parse_ipv4(address)
    if v4 is not None:
        ip, bits = ipaddress.IPv4Address(v4), 32
    else:
        v6 = _parse_ipv6(address)
        if v6 is None:
            return None
        ip, bits = ipaddress.IPv6Address(v6), 128
    n, used, ok = _dtoi(mask)
    if not ok or used != len(mask) or n > bits:
        return None
    return ip, n
