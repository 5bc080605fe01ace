"""The BpfKernel interface's emulated twin: fds, errors, links and hooks."""

from __future__ import annotations

import errno

import pytest

from emulation.bpf import R0, Asm, AttachType, MapSpec, MapType, ProgType, SockAddr
from kproxy.errors import InvalidArgument, KernelError
from kproxy.kernel import BpfKernel, EmulatedBpf, LinuxBpf, ProgramSpec


def _allow() -> bytes:
    return Asm().mov(R0, 1).exit().assemble()


def test_both_kernels_implement_the_interface() -> None:
    """EmulatedBpf and LinuxBpf are BpfKernels."""
    assert isinstance(EmulatedBpf(), BpfKernel)
    assert isinstance(LinuxBpf(), BpfKernel)  # construction makes no syscall


def test_map_errors_become_kernel_errors_with_the_errno() -> None:
    """EEXIST from a NOEXIST update arrives as KernelError(errno.EEXIST)."""
    k = EmulatedBpf()
    fd = k.create_map(MapSpec(type=MapType.HASH, key_size=4, value_size=4, max_entries=4))
    k.update(fd, bytes(4), bytes(4))
    with pytest.raises(KernelError) as e:
        k.update(fd, bytes(4), bytes(4), 1)
    assert e.value.errno == errno.EEXIST
    assert k.delete(fd, bytes(4)) and not k.delete(fd, bytes(4))


def test_a_program_naming_an_unknown_map_fd_is_refused() -> None:
    """lddw of an fd that is no map is refused at load, as the verifier does."""
    k = EmulatedBpf()
    code = Asm().ld_map(R0, "m").mov(R0, 0).exit().assemble({"m": 99})
    with pytest.raises(KernelError, match="fd 99"):
        k.load_program(ProgramSpec(type=ProgType.SCHED_CLS, code=code, name="x"))


def test_a_sock_addr_program_needs_its_hook_and_a_valid_name() -> None:
    """expected_attach_type is required for cgroup sock_addr programs; names are short."""
    with pytest.raises(InvalidArgument):
        ProgramSpec(type=ProgType.CGROUP_SOCK_ADDR, code=_allow())
    with pytest.raises(InvalidArgument):
        ProgramSpec(type=ProgType.SCHED_CLS, code=_allow(), name="a name with spaces")


def test_closing_the_link_detaches_the_program() -> None:
    """A closed link no longer runs at its hook; the program stays loaded."""
    k = EmulatedBpf()
    prog = k.load_program(ProgramSpec(type=ProgType.CGROUP_SOCK_ADDR, code=_allow(), name="c",
                                      attach=AttachType.CGROUP_INET4_CONNECT))
    link = k.attach_cgroup(prog, "/cg", AttachType.CGROUP_INET4_CONNECT)
    ctx = SockAddr(attach=AttachType.CGROUP_INET4_CONNECT, user_ip="10.0.0.1", user_port=80)
    assert k.run_sock_addr("/cg/pod", ctx) is not None
    k.close(link)
    assert k.run_sock_addr("/cg/pod", ctx) is None
    with pytest.raises(KernelError):
        k.close(link)


def test_a_program_cannot_attach_at_another_hook() -> None:
    """A connect4 program refuses getpeername4."""
    k = EmulatedBpf()
    prog = k.load_program(ProgramSpec(type=ProgType.CGROUP_SOCK_ADDR, code=_allow(), name="c",
                                      attach=AttachType.CGROUP_INET4_CONNECT))
    with pytest.raises(KernelError):
        k.attach_cgroup(prog, "/cg", AttachType.CGROUP_INET4_GETPEERNAME)


def test_closed_map_and_program_fds_stay_alive_while_referenced() -> None:
    """As the kernel's reference counts: a linked program runs after its fd and its map's fd
    are closed."""
    k = EmulatedBpf()
    m = k.create_map(MapSpec(type=MapType.ARRAY, key_size=4, value_size=4, max_entries=1))
    k.update(m, bytes(4), (1).to_bytes(4, "little"))
    code = Asm().ld_map_value(R0, "m").ldx(4, R0, R0, 0).exit().assemble({"m": m})
    prog = k.load_program(ProgramSpec(type=ProgType.CGROUP_SOCK_ADDR, code=code, name="c",
                                      attach=AttachType.CGROUP_INET4_CONNECT))
    k.attach_cgroup(prog, "/cg", AttachType.CGROUP_INET4_CONNECT)
    k.close(prog)
    k.close(m)
    res = k.run_sock_addr("/cg", SockAddr(attach=AttachType.CGROUP_INET4_CONNECT, user_ip="1.2.3.4",
                                          user_port=1))
    assert res is not None and res.ret32 == 1
