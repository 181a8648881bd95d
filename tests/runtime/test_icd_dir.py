"""Runtime, discovery: the folder of ICD files written for an unregistered vendor driver is
private (0700, ours, no symbolic links, files written afresh), so that no other local user can
choose which driver library the OpenCL loader opens."""

from __future__ import annotations

import hashlib
import os
import stat
import tempfile
from pathlib import Path

import pytest

from clops.runtime import discovery

REGISTERED = "libpocl.so.2.10.02\n"
# What the folder must hold, exactly: the registered ICD file kept, the missing driver added.
EXPECTED = {"pocl.icd": REGISTERED, "clops-nvidia.icd": "libnvidia-opencl.so.1\n"}
EVIL = "/home/someone-else/libevil.so\n"


@pytest.fixture
def setting(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A system with PoCL registered and NVIDIA's driver installed but not registered; the cache
    folder and the temporary folder under ``tmp_path``."""
    vendors = tmp_path / "vendors"
    vendors.mkdir()
    (vendors / "pocl.icd").write_text(REGISTERED)
    monkeypatch.setattr(discovery, "_registered_icds", lambda: [str(vendors / "pocl.icd")])
    monkeypatch.setattr(discovery, "_find_vendor_libraries", lambda: ["libnvidia-opencl.so.1"])
    (tmp_path / "tmp").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    monkeypatch.setenv("CLOPS_CACHE_DIR", str(tmp_path / "cache"))
    # NOTE: set first, so that monkeypatch restores (or removes) it afterwards: delenv of an
    # unset variable records nothing, and the folder the test registers leaked into later tests
    # (a subprocess then saw only that folder's drivers)
    monkeypatch.setenv("OCL_ICD_VENDORS", "")
    monkeypatch.delenv("OCL_ICD_VENDORS")
    return tmp_path


def _register() -> Path:
    # as a new process would: the folder an earlier call chose is not in its environment
    os.environ.pop("OCL_ICD_VENDORS", None)
    folder = discovery._register_unlisted_drivers()
    assert folder is not None and os.environ["OCL_ICD_VENDORS"] == folder
    return Path(folder)


def _assert_private_with_expected_files(folder: Path) -> None:
    st = os.lstat(folder)
    assert stat.S_ISDIR(st.st_mode) and not stat.S_ISLNK(st.st_mode)
    assert stat.S_IMODE(st.st_mode) == 0o700
    assert st.st_uid == os.getuid()
    assert {p.name: p.read_text() for p in folder.iterdir()} == EXPECTED


def test_folder_is_private_and_under_the_cache(setting: Path) -> None:
    folder = _register()
    _assert_private_with_expected_files(folder)
    assert folder == Path(discovery.icd_folder_path(EXPECTED)).resolve()
    assert folder.is_relative_to((setting / "cache").resolve())
    parent = os.lstat(folder.parent)
    assert stat.S_IMODE(parent.st_mode) == 0o700 and parent.st_uid == os.getuid()
    assert os.listdir(setting / "tmp") == []


def test_the_old_predictable_folder_is_not_used(setting: Path) -> None:
    # What another user could make in the shared temporary folder before clops ran.
    digest = hashlib.sha256(repr(sorted(EXPECTED.items())).encode()).hexdigest()[:16]
    planted = setting / "tmp" / f"clops-icd-{os.getuid()}-{digest}"
    planted.mkdir(mode=0o777)
    (planted / "evil.icd").write_text(EVIL)
    (planted / "clops-nvidia.icd").write_text(EVIL)
    folder = _register()
    assert not folder.is_relative_to(planted.resolve())
    _assert_private_with_expected_files(folder)
    assert (planted / "clops-nvidia.icd").read_text() == EVIL  # not ours: left as it was


@pytest.mark.parametrize("where", ["folder", "its parent"])
def test_a_symbolic_link_is_refused(setting: Path, where: str) -> None:
    elsewhere = setting / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    (elsewhere / "evil.icd").write_text(EVIL)
    path = Path(discovery.icd_folder_path(EXPECTED))
    if where == "its parent":
        path = path.parent
    path.parent.mkdir(parents=True, exist_ok=True)
    path.symlink_to(elsewhere, target_is_directory=True)
    with pytest.warns(RuntimeWarning, match="symbolic link"):
        folder = _register()
    # A fresh private folder of this process instead; nothing written where the link points.
    assert folder.is_relative_to((setting / "tmp").resolve())
    _assert_private_with_expected_files(folder)
    assert os.listdir(elsewhere) == ["evil.icd"]
    assert path.is_symlink()


def test_files_are_written_afresh(setting: Path) -> None:
    folder = _register()
    (folder / "clops-nvidia.icd").write_text(EVIL)
    (folder / "evil.icd").write_text(EVIL)
    (folder / "sub.icd").mkdir()
    os.chmod(folder, 0o777)
    assert _register() == folder
    _assert_private_with_expected_files(folder)


def test_a_folder_writable_by_others_above_is_refused(setting: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    shared = setting / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)  # anyone could rename the cache folder in it and put theirs there
    monkeypatch.setenv("CLOPS_CACHE_DIR", str(shared / "cache"))
    with pytest.warns(RuntimeWarning, match="writable by other users"):
        folder = _register()
    assert folder.is_relative_to((setting / "tmp").resolve())
    _assert_private_with_expected_files(folder)


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0,
                    reason="only root can give a folder to another user")
def test_a_folder_of_another_user_is_refused(setting: Path) -> None:
    path = Path(discovery.icd_folder_path(EXPECTED))
    path.mkdir(parents=True, mode=0o700)
    (path / "evil.icd").write_text(EVIL)
    os.chown(path, 4242, 4242)
    with pytest.warns(RuntimeWarning, match="belongs to uid 4242"):
        folder = _register()
    assert folder.is_relative_to((setting / "tmp").resolve())
    _assert_private_with_expected_files(folder)
    assert os.listdir(path) == ["evil.icd"]


def test_an_unwritable_cache_falls_back_to_a_temporary_folder(setting: Path,
                                                              monkeypatch: pytest.MonkeyPatch
                                                              ) -> None:
    (setting / "file").write_text("a file, not a folder")
    monkeypatch.setenv("CLOPS_CACHE_DIR", str(setting / "file" / "cache"))
    with pytest.warns(RuntimeWarning, match="cannot be used"):
        folder = _register()
    _assert_private_with_expected_files(folder)
