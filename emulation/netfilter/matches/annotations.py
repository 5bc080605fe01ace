"""Matches that decide nothing about the packet: ``comment`` and ``nfacct`` always hold, and a
module the emulator does not model (lenient mode) is always unknown.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from emulation.netfilter.context import Ctx
from emulation.netfilter.matches.base import Match, Pred
from emulation.netfilter.tokens import quote

__all__ = ["Comment", "Nfacct", "UnknownMatch"]


@dataclass(frozen=True, slots=True)
class Comment(Match):
    """``-m comment --comment TEXT``: always matches (xt_comment.c)."""

    text: str
    module: ClassVar[str] = "comment"

    def test(self, ctx: Ctx, uid: int) -> bool | None:
        return True

    def compile(self, uid: int) -> Pred | None:
        return None

    def save_args(self) -> list[str]:
        return ["--comment", quote(self.text) if self.text else '""']


@dataclass(frozen=True, slots=True)
class Nfacct(Match):
    """``-m nfacct --nfacct-name NAME``: counts in the kernel's accounting object; always matches."""

    name: str
    module: ClassVar[str] = "nfacct"

    def test(self, ctx: Ctx, uid: int) -> bool | None:
        return True

    def compile(self, uid: int) -> Pred | None:
        return None

    def save_args(self) -> list[str]:
        return ["--nfacct-name", self.name]


@dataclass(frozen=True, slots=True)
class UnknownMatch(Match):
    """A match module the emulator does not model (lenient mode): always evaluates to unknown."""

    name: str
    args: tuple[str, ...] = ()

    @property
    def module(self) -> str:  # type: ignore[override]
        return self.name

    def test(self, ctx: Ctx, uid: int) -> bool | None:
        return None

    def compile(self, uid: int) -> Pred | None:
        return lambda ctx: None

    def save_args(self) -> list[str]:
        return [a if a == "!" or a.startswith("-") else quote(a) for a in self.args]
