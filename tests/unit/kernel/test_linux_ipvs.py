"""LinuxIpvs: the ipvsadm, ipset and ip commands it runs, and how it reads the kernel's state back."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from emulation.ipvs import DestSpec, ServiceKey, ServiceSpec, parse_address
from kproxy.errors import KernelError
from kproxy.kernel import IpvsKernel, LinuxIpvs
from kproxy.kernel.linux import CommandResult

VIP = parse_address("10.96.0.10")
KEY = ServiceKey(version=4, protocol="tcp", addr=VIP[1], port=80)
REAL = DestSpec(addr=parse_address("10.244.1.5"), port=8080, weight=1)

SAVE = "-A -t 10.96.0.10:80 -s rr\n-a -t 10.96.0.10:80 -r 10.244.1.5:8080 -m -w 1\n"
LIST = """IP Virtual Server version 1.2.1 (size=4096)
Prot LocalAddress:Port Scheduler Flags
  -> RemoteAddress:Port           Forward Weight ActiveConn InActConn
TCP  10.96.0.10:80 rr
  -> 10.244.1.5:8080              Masq    1      3          7
"""


class Recorder:
    """Runs nothing: records each argv and answers from a table of canned outputs."""

    def __init__(self, answers: dict[tuple[str, ...], CommandResult] | None = None) -> None:
        self.calls: list[tuple[tuple[str, ...], str | None]] = []
        self.answers = answers or {}

    def __call__(self, argv: Sequence[str], stdin: str | None) -> CommandResult:
        self.calls.append((tuple(argv), stdin))
        done = CommandResult(argv=tuple(argv), returncode=0, stdout="", stderr="")
        return self.answers.get(tuple(argv), done)


def _ok(argv: tuple[str, ...], stdout: str) -> CommandResult:
    return CommandResult(argv=argv, returncode=0, stdout=stdout, stderr="")


def test_linux_ipvs_is_an_ipvs_kernel() -> None:
    """LinuxIpvs satisfies the narrow IpvsKernel interface the ipvs mode programs through."""
    assert isinstance(LinuxIpvs(run=Recorder()), IpvsKernel)


def test_virtual_and_real_server_operations_are_ipvsadm_commands() -> None:
    """Add, edit and delete of virtual and real servers run the ipvsadm command lines an operator would."""
    run = Recorder()
    ipvs = LinuxIpvs(run=run)
    ipvs.add_virtual_server(ServiceSpec(key=KEY, scheduler="rr"))
    ipvs.update_virtual_server(ServiceSpec(key=KEY, scheduler="lc"))
    ipvs.add_real_server(KEY, REAL)
    ipvs.update_real_server(KEY, DestSpec(addr=REAL.addr, port=REAL.port, weight=0))
    ipvs.delete_real_server(KEY, REAL.key)
    ipvs.delete_virtual_server(KEY)
    assert [argv for argv, _ in run.calls] == [
        ("ipvsadm", "-A", "-t", "10.96.0.10:80", "-s", "rr"),
        ("ipvsadm", "-E", "-t", "10.96.0.10:80", "-s", "lc"),
        ("ipvsadm", "-a", "-t", "10.96.0.10:80", "-r", "10.244.1.5:8080", "-m", "-w", "1"),
        ("ipvsadm", "-e", "-t", "10.96.0.10:80", "-r", "10.244.1.5:8080", "-m", "-w", "0"),
        ("ipvsadm", "-d", "-t", "10.96.0.10:80", "-r", "10.244.1.5:8080"),
        ("ipvsadm", "-D", "-t", "10.96.0.10:80"),
    ]


def test_the_state_is_read_back_with_connection_counts() -> None:
    """virtual_servers() reads specs from ipvsadm -Sn and ActiveConn/InActConn from ipvsadm -Ln."""
    run = Recorder({("ipvsadm", "-Sn"): _ok(("ipvsadm", "-Sn"), SAVE),
                    ("ipvsadm", "-Ln"): _ok(("ipvsadm", "-Ln"), LIST)})
    info = LinuxIpvs(run=run).virtual_server(KEY)
    assert info is not None and info.spec.scheduler == "rr"
    real = info.find(REAL.key)
    assert real is not None and (real.spec.weight, real.active_conns, real.inactive_conns) == (1, 3, 7)


def test_bound_addresses_are_made_exact_on_kube_ipvs0() -> None:
    """bind_addresses adds what is missing and deletes what is no longer wanted, nothing else."""
    shown = '[{"ifname": "kube-ipvs0", "addr_info": [{"local": "10.96.0.10"}, {"local": "10.96.0.99"}]}]'
    argv = ("ip", "-j", "-4", "addr", "show", "dev", "kube-ipvs0")
    run = Recorder({argv: _ok(argv, shown)})
    LinuxIpvs(run=run).bind_addresses(("10.96.0.10", "10.96.0.11"))
    assert [a for a, _ in run.calls[1:]] == [("ip", "addr", "add", "10.96.0.11/32", "dev", "kube-ipvs0"),
                                             ("ip", "addr", "del", "10.96.0.99/32", "dev", "kube-ipvs0")]


def test_a_refused_command_is_a_kernel_error_with_its_stderr() -> None:
    """A non-zero exit (IPVS missing, say) raises KernelError quoting the command and its stderr."""
    argv = ("ipset", "restore", "-exist")
    run = Recorder({argv: CommandResult(argv=argv, returncode=1, stdout="", stderr="Kernel error received")})
    with pytest.raises(KernelError, match=r"ipset restore -exist failed.*Kernel error received"):
        LinuxIpvs(run=run).restore_ipsets("create KUBE-CLUSTER-IP hash:ip,port\n")
