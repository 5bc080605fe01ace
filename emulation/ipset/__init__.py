"""A model of Linux ipset (``net/netfilter/ipset/``) for the types kube-proxy uses.

``hash:ip``, ``hash:ip,port``, ``hash:ip,port,ip``, ``hash:ip,port,net``, ``hash:net`` and
``bitmap:port``, with ``ipset save``/``restore`` text. :meth:`IpsetTable.lookup` is the
``set_lookup`` callable the netfilter model's ``-m set`` match takes.
"""

from emulation.ipset.errors import IpsetError
from emulation.ipset.ipset import IpSet, IpsetTable
from emulation.ipset.settypes import TYPES, SetType, format_element, parse_element
from emulation.ipset.text import format_save, load_save

__all__ = [
    "TYPES",
    "IpSet",
    "IpsetError",
    "IpsetTable",
    "SetType",
    "format_element",
    "format_save",
    "load_save",
    "parse_element",
]
