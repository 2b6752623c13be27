"""The README documents every variable opdump reads."""

import re

from conftest import ROOT


def test_every_variable_is_documented():
    src = (ROOT / "src" / "config.rs").read_text()
    table = src[src.index("pub const VARIABLES"):]
    names = re.findall(r'\("(OPDUMP\w*)",', table[: table.index("];")])
    readme = (ROOT / "README.md").read_text()
    assert len(names) >= 15
    for name in names:
        assert f"| `{name}` |" in readme, f"{name} is not in the README's table"
    # ... and the code reads no OPDUMP_* name the table does not list.
    used = set()
    for path in list((ROOT / "src").rglob("*.rs")) + list((ROOT / "cpp").rglob("*.cpp")) + [ROOT / "build.rs"]:
        text = path.read_text().split("#[cfg(test)]")[0]  # unit tests use made-up names
        used |= set(re.findall(r'"(OPDUMP_[A-Z0-9_]+)"', text))
    used |= set(re.findall(r'"(OPDUMP_[A-Z0-9_]+)"', (ROOT / "crates/torchfind/src/lib.rs").read_text()))
    assert used <= set(names), used - set(names)
