"""The sandbox's copy of certifi's bundle is found without importing certifi (sandbox/launch.py
``certifi_bundles``): its where() goes through importlib.resources and zipfile, 10-14 ms on a
run's way to exec (issue 13). It must name the file where() names."""

from __future__ import annotations

import os
import subprocess
import sys

import certifi

from sandgate.sandbox.launch import certifi_bundles


def test_the_bundle_is_certifis_own() -> None:
    where = os.path.realpath(certifi.where())
    expected = [where] if where.startswith(("/opt/", "/usr/")) else []
    assert certifi_bundles() == expected


def test_finding_it_imports_neither_certifi_nor_zipfile() -> None:
    code = (
        "import sys; from sandgate.sandbox.launch import certifi_bundles; "
        "before = set(sys.modules); found = certifi_bundles(); "
        "print(found, sorted(m for m in ('certifi', 'zipfile', 'importlib.resources') "
        "if m in sys.modules and m not in before))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip().endswith("[]"), out.stdout
