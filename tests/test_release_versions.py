"""The release command's choice of torch versions (scripts/release_versions.py),
on a list shaped like PyPI's, without the network; and that CI stays off
the release command (it downloads every torch in the range)."""

import importlib.util

from conftest import ROOT

spec = importlib.util.spec_from_file_location("release_versions", ROOT / "scripts" / "release_versions.py")
rv = importlib.util.module_from_spec(spec)
spec.loader.exec_module(rv)

LINUX = [{"filename": "torch-X-cp311-cp311-manylinux_2_28_x86_64.whl"}]
MAC = [{"filename": "torch-X-cp311-none-macosx_11_0_arm64.whl"}]
RELEASES = {
    "2.10.0": LINUX,             # below the range
    "2.11.0": LINUX,
    "2.12.0": LINUX,
    "2.12.1": LINUX,             # the newest 2.12
    "2.13.0rc1": LINUX,          # not a final release
    "2.13.0": MAC,               # no Linux wheel to build from
    "2.14.0": LINUX,
    "2.14.1": [{**LINUX[0], "yanked": True}],
    "2.14.10": LINUX,            # newer than 2.14.9 by number, not by text
    "2.14.9": LINUX,
    "2.16.0": LINUX,             # above the range
}


def test_newest_patch_of_each_minor_in_the_range():
    assert rv.choose(RELEASES, (2, 11), (2, 16)) == ["2.11.0", "2.12.1", "2.14.10"]


def test_all_patches():
    assert rv.choose(RELEASES, (2, 11), (2, 16), all_patches=True) == [
        "2.11.0", "2.12.0", "2.12.1", "2.14.0", "2.14.9", "2.14.10"]


def test_the_range_is_the_wheels_requirement():
    text = (ROOT / "pyproject.toml").read_text()
    assert '"torch>=2.11,<2.16"' in text
    assert rv.wheel_range() == ((2, 11), (2, 16))


def test_ci_builds_the_reference_core_only():
    for f in (ROOT / ".ci" / "run", ROOT / "scripts" / "test.sh", ROOT / "scripts" / "setup.sh"):
        text = f.read_text()
        assert "release.sh" not in text and "target-cores" not in text, f
