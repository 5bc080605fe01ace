"""Small builders for the BPF machine tests."""

from __future__ import annotations

from emulation.bpf import R0, Asm, Machine, RunResult


def run(a: Asm, machine: Machine | None = None) -> RunResult:
    """Run ``a`` (no context, no maps unless ``machine`` has them)."""
    return (machine or Machine({})).run(a.assemble())


def r0_of(build: Asm) -> int:
    """r0 after running ``build`` followed by ``exit``."""
    build.exit()
    return run(build).ret


def program(*steps: tuple[str, tuple[object, ...]]) -> Asm:
    """An Asm from ``(method, args)`` pairs (handy for parametrised cases)."""
    a = Asm()
    for name, args in steps:
        getattr(a, name)(*args)
    return a


__all__ = ["R0", "program", "r0_of", "run"]
