"""A Linux bzImage's payload, unpacked into the ELF that QEMU boots directly (PVH), as pure
functions of bytes.

Why: under TCG the guest spends most of its boot decompressing itself. Debian's 6.1 kernel is an
8 MB xz payload that becomes a 66 MB vmlinux, and the emulated decompressor took ~8 s of a ~20 s
``--vm`` run (2026-12-02). QEMU loads an ELF ``-kernel`` that carries a Xen PVH entry note
(XEN_ELFNOTE_PHYS32_ENTRY, from ``CONFIG_PVH``) straight into guest memory and starts it at that
entry: no decompressor runs. The price: the kernel's own KASLR is done by the decompressor, so a
PVH-booted guest has none (see docs/NOTES.md: the guest's kernel is not the boundary).
"""

from __future__ import annotations

import lzma
import struct
import zlib

HDRS_MAGIC = b"HdrS"  # at 0x202 in every bzImage (boot protocol 2.00+)
MIN_PROTOCOL = 0x208  # payload_offset/payload_length exist from 2.08
XEN_NOTE_NAME = b"Xen\x00"
XEN_ELFNOTE_PHYS32_ENTRY = 18
PT_NOTE = 4


def payload(bz: bytes) -> bytes | None:
    """The compressed kernel inside a bzImage, or None if ``bz`` is not one (boot protocol
    2.08+: ``setup_sects`` at 0x1f1, ``payload_offset``/``payload_length`` at 0x248)."""
    if len(bz) < 0x250 or bz[0x202:0x206] != HDRS_MAGIC:
        return None
    (version,) = struct.unpack_from("<H", bz, 0x206)
    if version < MIN_PROTOCOL:
        return None
    setup_sects = bz[0x1F1] or 4  # 0 means 4 (the oldest loaders' convention)
    offset, length = struct.unpack_from("<II", bz, 0x248)
    start = (setup_sects + 1) * 512 + offset
    if length == 0 or start + length > len(bz):
        return None
    return bz[start : start + length]


def decompress(data: bytes) -> bytes | None:
    """The payload unpacked, for the formats the standard library reads (xz, lzma, gzip);
    None for others (zstd, lz4, bzip2, lzo: the guest then boots the bzImage as before). The
    kernel's build appends the uncompressed size after the stream: it is ignored."""
    try:
        if data.startswith(b"\xfd7zXZ\x00"):
            return lzma.LZMADecompressor(format=lzma.FORMAT_XZ).decompress(data)
        if data.startswith(b"\x5d\x00\x00"):
            return lzma.LZMADecompressor(format=lzma.FORMAT_ALONE).decompress(data)
        if data.startswith(b"\x1f\x8b"):
            return zlib.decompressobj(16 + zlib.MAX_WBITS).decompress(data)
    except (lzma.LZMAError, zlib.error):
        return None
    return None


def has_pvh_entry(elf: bytes) -> bool:
    """Whether an ELF64 little-endian image has a Xen PHYS32_ENTRY note (what QEMU needs to boot
    it as PVH; without one it refuses the ELF)."""
    if len(elf) < 64 or elf[:4] != b"\x7fELF" or elf[4] != 2 or elf[5] != 1:
        return False
    (phoff,) = struct.unpack_from("<Q", elf, 0x20)
    phentsize, phnum = struct.unpack_from("<HH", elf, 0x36)
    for i in range(phnum):
        base = phoff + i * phentsize
        if base + 56 > len(elf):
            return False
        p_type, _flags, p_offset, _va, _pa, p_filesz = struct.unpack_from("<IIQQQQ", elf, base)
        if p_type == PT_NOTE and _notes_have_entry(elf[p_offset : p_offset + p_filesz]):
            return True
    return False


def _notes_have_entry(notes: bytes) -> bool:
    pos = 0
    while pos + 12 <= len(notes):
        namesz, descsz, kind = struct.unpack_from("<III", notes, pos)
        name_at = pos + 12
        desc_at = name_at + _align4(namesz)
        if notes[name_at : name_at + namesz] == XEN_NOTE_NAME and kind == XEN_ELFNOTE_PHYS32_ENTRY:
            return bool(descsz >= 4)
        pos = desc_at + _align4(descsz)
    return False


def _align4(n: int) -> int:
    return (n + 3) & ~3


def pvh_kernel(bz: bytes) -> bytes | None:
    """The ELF kernel a bzImage carries, if QEMU can boot it as PVH; else None."""
    packed = payload(bz)
    if packed is None:
        return None
    elf = decompress(packed)
    if elf is None or not has_pvh_entry(elf):
        return None
    return elf
