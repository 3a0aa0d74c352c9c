"""Where a field of a kernel struct lies, from the running kernel's BTF (/sys/kernel/btf/vmlinux).

A BPF program that reads a kernel object through a typed pointer (a ``struct tcp_sock *`` from
``bpf_skc_to_tcp_sock``) loads from the field's byte offset, and that offset differs between
kernels. Without libbpf or bpftool on these machines, this reads the few parts of the BTF format
it needs (Documentation/bpf/btf.rst): the header, the type records (to step over them and to
find a struct by name), and the string section. Members of anonymous structs and unions inside
the struct are found too, at their summed offsets.
"""

from __future__ import annotations

import struct
from functools import cache
from pathlib import Path

VMLINUX = Path("/sys/kernel/btf/vmlinux")
_MAGIC = 0xEB9F
_STRUCT, _UNION = 4, 5
# Bytes that follow a type record's 12-byte head, by kind: a fixed size, or a size per vlen item.
_FIXED = {1: 4, 3: 12, 14: 4, 17: 4}  # INT, ARRAY, VAR, DECL_TAG
_PER_ITEM = {4: 12, 5: 12, 6: 8, 13: 8, 15: 12, 19: 12}  # STRUCT, UNION, ENUM, FUNC_PROTO, ...


class BtfError(LookupError):
    """The kernel's BTF is missing, malformed, or has no such struct or field."""


@cache
def _types(path: Path) -> tuple[bytes, int, list[tuple[int, int, int, int]]]:
    """The file, where its strings start, and every type record as (name_off, kind, vlen,
    offset of its items), indexed by type id (id 0 is void)."""
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise BtfError(f"no kernel BTF: {exc}") from exc
    magic, _version, _flags, hdr_len, type_off, type_len, str_off, str_len = struct.unpack_from(
        "<HBBIIIII", raw
    )
    if magic != _MAGIC:
        raise BtfError(f"{path}: not BTF")
    if hdr_len + str_off + str_len > len(raw):
        raise BtfError(f"{path}: truncated")
    records: list[tuple[int, int, int, int]] = [(0, 0, 0, 0)]
    pos, end = hdr_len + type_off, hdr_len + type_off + type_len
    while pos < end:
        name_off, info, _size = struct.unpack_from("<III", raw, pos)
        kind, vlen = (info >> 24) & 0x1F, info & 0xFFFF
        records.append((name_off, kind, vlen, pos + 12))
        pos += 12 + _FIXED.get(kind, 0) + _PER_ITEM.get(kind, 0) * vlen
    return raw, hdr_len + str_off, records


def _name(raw: bytes, strings: int, off: int) -> str:
    start = strings + off
    return raw[start : raw.index(b"\0", start)].decode()


def member_offset(struct_name: str, field: str, path: Path = VMLINUX) -> int:
    """The byte offset of ``field`` in ``struct struct_name`` (looking into anonymous members)."""
    raw, strings, records = _types(path)
    for type_id, (name_off, kind, _vlen, _items) in enumerate(records):
        if kind == _STRUCT and _name(raw, strings, name_off) == struct_name:
            found = _find(raw, strings, records, type_id, field)
            if found is not None:
                return found
    raise BtfError(f"struct {struct_name} has no field {field} in {path}")


def _find(
    raw: bytes, strings: int, records: list[tuple[int, int, int, int]], type_id: int, field: str
) -> int | None:
    _name_off, _kind, vlen, items = records[type_id]
    kind_flag = struct.unpack_from("<I", raw, items - 8)[0] >> 31
    for i in range(vlen):
        m_name, m_type, m_off = struct.unpack_from("<III", raw, items + 12 * i)
        bits: int = m_off & 0xFFFFFF if kind_flag else m_off
        if m_name and _name(raw, strings, m_name) == field:
            if bits % 8 or (kind_flag and m_off >> 24):  # a bit offset, or a bit field's size
                raise BtfError(f"{field} is a bit field")
            return bits // 8
        if not m_name:  # an anonymous struct or union: its members are the struct's own
            inner = _resolve(raw, records, m_type)
            if records[inner][1] in (_STRUCT, _UNION):
                found = _find(raw, strings, records, inner, field)
                if found is not None:
                    return bits // 8 + found
    return None


def _resolve(raw: bytes, records: list[tuple[int, int, int, int]], type_id: int) -> int:
    """Through typedefs and qualifiers (TYPEDEF, VOLATILE, CONST, RESTRICT, TYPE_TAG)."""
    while records[type_id][1] in (8, 9, 10, 11, 18):
        type_id = struct.unpack_from("<I", raw, records[type_id][3] - 4)[0]
    return type_id
