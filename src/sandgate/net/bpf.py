"""eBPF without a compiler: the few instructions sandgate uses, assembled here; bpf(2) by ctypes.

Why by hand: the machines sandgate runs on have no clang, LLVM or libbpf, gcc has no BPF target,
and nothing well kept on PyPI assembles eBPF without LLVM (``bpf-asm`` is the classic-BPF
assembler from the kernel's tools; bcc needs LLVM at run time). The one program sandgate loads
(gateway/proxy/sockmap.py) is some eighty instructions, so this module encodes exactly the
opcodes it needs, each checked against the kernel's encoding in tests/unit/test_sockmap.py, and
places jumps by label (``assemble``), and nothing else.

An instruction is 8 bytes (include/uapi/linux/bpf.h, ``struct bpf_insn``): opcode, dst and src
register in one byte (dst in the low nibble), a signed 16-bit offset and a signed 32-bit
immediate, little-endian. A 64-bit immediate (``ld_map_fd``) takes two instructions.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import platform
import struct
from collections.abc import Sequence
from dataclasses import dataclass

# bpf(2) commands, map and program types, attach types, helpers: include/uapi/linux/bpf.h.
MAP_CREATE, MAP_UPDATE_ELEM, MAP_DELETE_ELEM, MAP_GET_NEXT_KEY = 0, 2, 3, 4
PROG_LOAD, PROG_ATTACH = 5, 8
MAP_TYPE_HASH, MAP_TYPE_ARRAY, MAP_TYPE_SOCKHASH = 1, 2, 18
F_MMAPABLE = 1 << 10  # BPF_F_MMAPABLE: an array user space maps and reads without a syscall
PROG_TYPE_SK_SKB = 14
SK_SKB_STREAM_VERDICT = 5
FUNC_MAP_LOOKUP_ELEM = 1
FUNC_GET_SOCKET_COOKIE = 46
FUNC_SK_REDIRECT_HASH = 72
FUNC_SK_RELEASE = 86
FUNC_SKC_TO_TCP_SOCK = 137
SK_DROP, SK_PASS = 0, 1
ANY = 0  # BPF_ANY: create or replace a map element

_NR_BPF = {"x86_64": 321, "aarch64": 280}

# Opcodes (class | size/op | source): only the ones the assembler below emits.
_ALU64_MOV_X = 0xBF  # BPF_ALU64 | BPF_MOV | BPF_X: dst = src
_ALU64_MOV_K = 0xB7  # BPF_ALU64 | BPF_MOV | BPF_K: dst = imm
_ALU64_ADD_K = 0x07  # BPF_ALU64 | BPF_ADD | BPF_K: dst += imm
_ALU64_ADD_X = 0x0F  # BPF_ALU64 | BPF_ADD | BPF_X: dst += src
_ALU64_SUB_X = 0x1F  # BPF_ALU64 | BPF_SUB | BPF_X: dst -= src
_ALU_SUB_X = 0x1C  # BPF_ALU | BPF_SUB | BPF_X: (u32) dst -= (u32) src, upper half zeroed
_STX_MEM_DW = 0x7B  # BPF_STX | BPF_MEM | BPF_DW: *(u64 *)(dst + off) = src
_STX_MEM_W = 0x63  # BPF_STX | BPF_MEM | BPF_W: *(u32 *)(dst + off) = src
_LDX_MEM_W = 0x61  # BPF_LDX | BPF_MEM | BPF_W: dst = *(u32 *)(src + off)
_LDX_MEM_DW = 0x79  # BPF_LDX | BPF_MEM | BPF_DW: dst = *(u64 *)(src + off)
_JMP_JEQ_K = 0x15  # BPF_JMP | BPF_JEQ | BPF_K: if dst == imm, skip off instructions
JNE_X = 0x5D  # BPF_JMP | BPF_JNE | BPF_X: if dst != src (for ``Jump``)
JSGE_K = 0x75  # BPF_JMP | BPF_JSGE | BPF_K: if (s64) dst >= imm
JEQ_K = _JMP_JEQ_K
JA = 0x05  # BPF_JMP | BPF_JA: always
_LD_IMM_DW = 0x18  # BPF_LD | BPF_IMM | BPF_DW: dst = 64-bit imm (two slots)
_JMP_CALL = 0x85  # BPF_JMP | BPF_CALL: r0 = helper imm (r1..r5), r1..r5 clobbered
_JMP_EXIT = 0x95  # BPF_JMP | BPF_EXIT: return r0
_PSEUDO_MAP_FD = 1  # src of a ld_imm64 whose imm is a map fd, turned into the map by the loader
R0, R1, R2, R3, R4, R5, R6, R7, R8, R9, R10 = range(11)  # r10: read-only frame pointer


class BpfError(OSError):
    """A bpf(2) call failed; ``log`` holds the verifier's words when a program was refused."""

    def __init__(self, errno: int, what: str, log: str = "") -> None:
        super().__init__(errno, f"{what}: {os.strerror(errno)}" + (f"\n{log}" if log else ""))
        self.log = log


def insn(code: int, dst: int = 0, src: int = 0, off: int = 0, imm: int = 0) -> bytes:
    """One encoded instruction."""
    return struct.pack("<BBhi", code, (src << 4) | dst, off, imm)


def mov_reg(dst: int, src: int) -> bytes:
    return insn(_ALU64_MOV_X, dst, src)


def mov_imm(dst: int, imm: int) -> bytes:
    return insn(_ALU64_MOV_K, dst, imm=imm)


def add_imm(dst: int, imm: int) -> bytes:
    return insn(_ALU64_ADD_K, dst, imm=imm)


def add_reg(dst: int, src: int) -> bytes:
    return insn(_ALU64_ADD_X, dst, src)


def sub_reg(dst: int, src: int) -> bytes:
    return insn(_ALU64_SUB_X, dst, src)


def sub32_reg(dst: int, src: int) -> bytes:
    """dst = (u32)(dst - src): a difference of sequence numbers, which wrap at 2**32."""
    return insn(_ALU_SUB_X, dst, src)


def store_dw(dst: int, off: int, src: int) -> bytes:
    return insn(_STX_MEM_DW, dst, src, off)


def store_w(dst: int, off: int, src: int) -> bytes:
    return insn(_STX_MEM_W, dst, src, off)


def load_w(dst: int, src: int, off: int) -> bytes:
    return insn(_LDX_MEM_W, dst, src, off)


def load_dw(dst: int, src: int, off: int) -> bytes:
    return insn(_LDX_MEM_DW, dst, src, off)


def jeq_imm(dst: int, imm: int, skip: int) -> bytes:
    """if dst == imm: jump over the next ``skip`` instructions."""
    return insn(_JMP_JEQ_K, dst, off=skip, imm=imm)


def ld_map_fd(dst: int, map_fd: int) -> bytes:
    """dst = the map behind ``map_fd`` (the second slot holds the immediate's upper half, 0)."""
    return insn(_LD_IMM_DW, dst, _PSEUDO_MAP_FD, imm=map_fd) + insn(0)


def call(helper: int) -> bytes:
    return insn(_JMP_CALL, imm=helper)


def exit_() -> bytes:
    return insn(_JMP_EXIT)


@dataclass(frozen=True)
class Jump:
    """A conditional (or, with ``JA``, plain) jump to a label, placed by ``assemble``."""

    code: int
    to: str
    dst: int = 0
    src: int = 0
    imm: int = 0


def assemble(items: Sequence[bytes | str | Jump]) -> bytes:
    """Instructions, jumps and labels (a ``str`` marks the place of the label it names) as one
    program, each jump's offset counted from the instruction after it."""
    places: dict[str, int] = {}
    at = 0
    for item in items:
        if isinstance(item, str):
            places[item] = at
        else:
            at += 1 if isinstance(item, Jump) else len(item) // 8
    out: list[bytes] = []
    at = 0
    for item in items:
        if isinstance(item, Jump):
            out.append(insn(item.code, item.dst, item.src, places[item.to] - at - 1, item.imm))
            at += 1
        elif not isinstance(item, str):
            out.append(item)
            at += len(item) // 8
    return b"".join(out)


# -- bpf(2) ------------------------------------------------------------------------------------

_libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
_libc.syscall.restype = ctypes.c_long


def _bpf(cmd: int, attr: bytes, what: str, log: ctypes.Array[ctypes.c_char] | None = None) -> int:
    nr = _NR_BPF.get(platform.machine())
    if nr is None:
        raise BpfError(38, f"{what}: no bpf(2) number known for {platform.machine()}")  # ENOSYS
    buf = ctypes.create_string_buffer(attr, len(attr))
    ret = _libc.syscall(ctypes.c_long(nr), ctypes.c_int(cmd), buf, ctypes.c_uint(len(attr)))
    if ret < 0:
        err = ctypes.get_errno()
        text = log.value.decode(errors="replace").strip() if log is not None else ""
        raise BpfError(err, what, text)
    return int(ret)


def _addr(buf: ctypes.Array[ctypes.c_char]) -> int:
    return ctypes.addressof(buf)


def map_create(
    map_type: int, key_size: int, value_size: int, max_entries: int, flags: int = 0
) -> int:
    """A new map's fd (close-on-exec, as every bpf fd is)."""
    attr = struct.pack("<IIIII", map_type, key_size, value_size, max_entries, flags)
    return _bpf(MAP_CREATE, attr, "creating a BPF map")


def map_update(map_fd: int, key: bytes, value: bytes, flags: int = ANY) -> None:
    k = ctypes.create_string_buffer(key, len(key))
    v = ctypes.create_string_buffer(value, len(value))
    _bpf(MAP_UPDATE_ELEM, struct.pack("<IIQQQ", map_fd, 0, _addr(k), _addr(v), flags), "map update")


def map_delete(map_fd: int, key: bytes) -> None:
    k = ctypes.create_string_buffer(key, len(key))
    _bpf(MAP_DELETE_ELEM, struct.pack("<IIQQQ", map_fd, 0, _addr(k), 0, 0), "map delete")


def map_keys(map_fd: int, key_size: int) -> list[bytes]:
    """Every key in the map now (BPF_MAP_GET_NEXT_KEY from none until ENOENT)."""
    keys: list[bytes] = []
    nxt = ctypes.create_string_buffer(key_size)
    cur: ctypes.Array[ctypes.c_char] | None = None
    while True:
        attr = struct.pack("<IIQQQ", map_fd, 0, 0 if cur is None else _addr(cur), _addr(nxt), 0)
        try:
            _bpf(MAP_GET_NEXT_KEY, attr, "map keys")
        except BpfError as exc:
            if exc.errno == 2:  # ENOENT: past the last key
                return keys
            raise
        keys.append(nxt.raw)
        cur = ctypes.create_string_buffer(nxt.raw, key_size)


def prog_load(prog_type: int, code: bytes, name: str, license: str = "GPL") -> int:
    """Load a program; on refusal the error carries the verifier's log. (GPL: the socket
    helpers are GPL-only.)"""
    insns = ctypes.create_string_buffer(code, len(code))
    lic = ctypes.create_string_buffer(license.encode())
    log = ctypes.create_string_buffer(1 << 16)
    attr = struct.pack(
        "<IIQQIIQII16sII",
        prog_type,
        len(code) // 8,
        _addr(insns),
        _addr(lic),
        1,  # log_level: the log is written only when the load fails
        len(log),
        _addr(log),
        0,
        0,
        name.encode()[:15],
        0,
        0,
    )
    return _bpf(PROG_LOAD, attr, f"loading BPF program {name}", log)


def prog_attach(target_fd: int, prog_fd: int, attach_type: int) -> None:
    attr = struct.pack("<IIII", target_fd, prog_fd, attach_type, 0)
    _bpf(PROG_ATTACH, attr, "attaching a BPF program")
