"""The public surfaces of emulation.ipvs and emulation.ipset are exactly their __all__."""

from __future__ import annotations

import emulation.ipset
import emulation.ipvs


def test_ipvs_exports_resolve() -> None:
    """Every name in emulation.ipvs.__all__ exists, and no public name is left out."""
    public = {n for n in vars(emulation.ipvs) if not n.startswith("_") and n.isidentifier()}
    modules = {n for n, v in vars(emulation.ipvs).items() if type(v).__name__ == "module"}
    assert set(emulation.ipvs.__all__) == public - modules


def test_ipset_exports_resolve() -> None:
    """Every name in emulation.ipset.__all__ exists, and no public name is left out."""
    public = {n for n in vars(emulation.ipset) if not n.startswith("_") and n.isidentifier()}
    modules = {n for n, v in vars(emulation.ipset).items() if type(v).__name__ == "module"}
    assert set(emulation.ipset.__all__) == public - modules


def test_emulation_never_imports_kproxy() -> None:
    """The kernel models stay standalone."""
    import pathlib

    root = pathlib.Path(emulation.ipvs.__file__).parent.parent
    for pkg in ("ipvs", "ipset"):
        for path in (root / pkg).glob("*.py"):
            text = path.read_text()
            assert "import kproxy" not in text and "from kproxy" not in text, path
