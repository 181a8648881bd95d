"""A vendor driver installed into the Python environment as a wheel (Intel's CPU runtime puts
``libintelocl.so`` in ``<prefix>/lib``, and an ICD file of its own that names a placeholder
path) is registered for the OpenCL loader by its full path, beside the registered drivers."""

from __future__ import annotations

import os

from clops.runtime import discovery


def test_a_driver_in_the_environment_is_registered_by_its_path(tmp_path, monkeypatch):
    prefix = tmp_path / "env"
    (prefix / "lib").mkdir(parents=True)
    lib = prefix / "lib" / "libintelocl.so"
    lib.write_bytes(b"")
    vendors = tmp_path / "vendors"
    vendors.mkdir()
    (vendors / "pocl.icd").write_text("libpocl.so.2\n")
    monkeypatch.setattr(discovery.sys, "prefix", str(prefix))
    monkeypatch.setenv("OCL_ICD_VENDORS", str(vendors))
    monkeypatch.setenv("CLOPS_CACHE_DIR", str(tmp_path / "cache"))
    folder = discovery._register_unlisted_drivers()
    assert folder is not None and os.environ["OCL_ICD_VENDORS"] == folder
    files = {f: open(os.path.join(folder, f)).read().strip() for f in os.listdir(folder)}
    assert files["clops-intel-cpu.icd"] == str(lib)
    assert files["pocl.icd"] == "libpocl.so.2"
    # once named by a registered ICD file, it is not added again
    monkeypatch.setenv("OCL_ICD_VENDORS", folder)
    assert discovery._register_unlisted_drivers() is None


def test_drivers_the_user_chose_are_kept_but_for_the_environments_own(tmp_path, monkeypatch):
    # OCL_ICD_VENDORS set by the user: a system library they left out stays out
    vendors = tmp_path / "vendors"
    vendors.mkdir()
    monkeypatch.setattr(discovery, "_find_vendor_libraries", lambda: ["libnvidia-opencl.so.1"])
    monkeypatch.setenv("OCL_ICD_VENDORS", str(vendors))
    monkeypatch.setenv("CLOPS_CACHE_DIR", str(tmp_path / "cache"))
    assert discovery._register_unlisted_drivers() is None
    assert os.environ["OCL_ICD_VENDORS"] == str(vendors)
