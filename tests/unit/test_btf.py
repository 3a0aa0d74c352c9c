"""net/btf.py against the running kernel's own BTF: fields whose place the UAPI fixes."""

from __future__ import annotations

from pathlib import Path

import pytest

from sandgate.net import btf

pytestmark = pytest.mark.skipif(not btf.VMLINUX.exists(), reason="this kernel has no BTF")


def test_a_field_at_the_top_of_a_struct_and_one_inside_an_anonymous_member() -> None:
    assert btf.member_offset("sockaddr_in", "sin_port") == 2  # include/uapi/linux/in.h
    # iphdr's addresses sit in an anonymous union's anonymous struct (__struct_group, 5.16)
    assert btf.member_offset("iphdr", "saddr") == 12
    assert btf.member_offset("iphdr", "daddr") == 16


def test_a_missing_field_a_bit_field_and_a_file_that_is_not_btf_are_errors(
    tmp_path: Path,
) -> None:
    with pytest.raises(btf.BtfError, match="no field"):
        btf.member_offset("iphdr", "no_such_field")
    with pytest.raises(btf.BtfError, match="bit field"):
        btf.member_offset("iphdr", "ihl")  # 4 bits
    junk = tmp_path / "vmlinux"
    junk.write_bytes(b"\0" * 64)
    with pytest.raises(btf.BtfError):
        btf.member_offset("iphdr", "daddr", junk)
    with pytest.raises(btf.BtfError):
        btf.member_offset("iphdr", "daddr", tmp_path / "missing")
