"""Raw memory access for the numba Kineto scanner (collectors/kineto/_scan_kernels.py).

numba reference-counts every array that is handed to an inlined helper (an atomic increment
and decrement per call, ~30% of the scanner's time when the helpers took arrays). The hot
helpers therefore take an array's base address (an integer, from :func:`addr`) and read and
write through these intrinsics, which compile to single machine loads and stores. No bounds
checks: callers keep every address inside an array that is alive for the whole call.
:func:`utf8_len` validates one UTF-8 sequence at an address (the scanner's cold path for
bytes >= 0x80 in strings).
"""

from __future__ import annotations

from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic

from ..progress import watch_compiles

__all__ = ["addr", "ldb", "ld8", "ldq", "stq", "stb", "utf8_len"]

_I8, _I64 = ir.IntType(8), ir.IntType(64)


@intrinsic
def addr(typingctx, arr):  # pragma: no cover - compiled
    """Address of the first element of the contiguous array ``arr`` (int64)."""
    sig = types.int64(arr)

    def codegen(context, builder, signature, args):
        ary = context.make_array(signature.args[0])(context, builder, args[0])
        return builder.ptrtoint(ary.data, _I64)

    return sig, codegen


@intrinsic
def ldb(typingctx, a):  # pragma: no cover - compiled
    """The byte at address ``a`` (int64, 0..255)."""
    sig = types.int64(types.int64)

    def codegen(context, builder, signature, args):
        return builder.zext(builder.load(builder.inttoptr(args[0], _I8.as_pointer())), _I64)

    return sig, codegen


@intrinsic
def ld8(typingctx, a):  # pragma: no cover - compiled
    """The 8 bytes at address ``a`` as a little-endian uint64 (unaligned)."""
    sig = types.uint64(types.int64)

    def codegen(context, builder, signature, args):
        return builder.load(builder.inttoptr(args[0], _I64.as_pointer()), align=1)

    return sig, codegen


@intrinsic
def ldq(typingctx, a):  # pragma: no cover - compiled
    """The int64 at the (8-byte aligned) address ``a``."""
    sig = types.int64(types.int64)

    def codegen(context, builder, signature, args):
        return builder.load(builder.inttoptr(args[0], _I64.as_pointer()), align=8)

    return sig, codegen


@intrinsic
def stq(typingctx, a, v):  # pragma: no cover - compiled
    """Store the int64 ``v`` at the (8-byte aligned) address ``a``."""
    sig = types.void(types.int64, types.int64)

    def codegen(context, builder, signature, args):
        builder.store(args[1], builder.inttoptr(args[0], _I64.as_pointer()), align=8)
        return context.get_dummy_value()

    return sig, codegen


@intrinsic
def stb(typingctx, a, v):  # pragma: no cover - compiled
    """Store the low byte of ``v`` at address ``a``."""
    sig = types.void(types.int64, types.int64)

    def codegen(context, builder, signature, args):
        builder.store(builder.trunc(args[1], _I8), builder.inttoptr(args[0], _I8.as_pointer()))
        return context.get_dummy_value()

    return sig, codegen


@njit(cache=True)
def utf8_len(b, i, n):  # pragma: no cover - compiled
    """Length of the UTF-8 sequence led by the byte at ``i`` (>= 0x80); -1 past the end, -2 invalid."""
    c = ldb(b + i)
    need = 0
    lo = 128
    hi = 191
    if 0xC2 <= c <= 0xDF:
        need = 1
    elif 0xE0 <= c <= 0xEF:
        need = 2
        if c == 0xE0:
            lo = 0xA0
        elif c == 0xED:
            hi = 0x9F
    elif 0xF0 <= c <= 0xF4:
        need = 3
        if c == 0xF0:
            lo = 0x90
        elif c == 0xF4:
            hi = 0x8F
    else:
        return -2
    if i + need >= n:
        return -1
    for k in range(1, need + 1):
        d = ldb(b + i + k)
        if k == 1:
            if d < lo or d > hi:
                return -2
        elif d < 128 or d > 191:
            return -2
    return need + 1

watch_compiles()  # say so on stderr when these kernels compile on first use
