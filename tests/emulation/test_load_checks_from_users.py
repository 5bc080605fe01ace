"""Old path of :mod:`tests.emulation.test_load_checks`, kept only because
tests/kernel/test_iptables_load_checks.py imports its cases from here; it holds no tests.
Remove it once that import names ``tests.emulation.test_load_checks``."""

from tests.emulation.test_load_checks import ACCEPTED, REFUSED, restore_text, saved_rules

__all__ = ["ACCEPTED", "REFUSED", "restore_text", "saved_rules"]
