"""The calls of corral.linux._csys (mount, umount2, prctl, prlimit, syscall, get_errno),
through ctypes: what _sys.py uses when that C module was not built (scripts/setup.sh
builds it; a plain `pip install` does not). The same arguments and results (_csys.c):
strings as bytes, words as int, None (NULL) or a writable buffer (a pointer to its bytes).

Through `_ctypes`, the C core of ctypes, with the C types below made exactly as ctypes
makes them: the ctypes package defines some thirty types on import (~0.7 ms)."""

from __future__ import annotations

import _ctypes
import os


class _Int(_ctypes._SimpleCData):      # ctypes.c_int
    _type_ = "i"


class _ULong(_ctypes._SimpleCData):    # ctypes.c_ulong
    _type_ = "L"


class _CharP(_ctypes._SimpleCData):    # ctypes.c_char_p
    _type_ = "z"


class _Char(_ctypes._SimpleCData):     # ctypes.c_char
    _type_ = "c"


class _Function(_ctypes.CFuncPtr):
    """A C function as ctypes.CDLL(None, use_errno=True) gives it: cdecl, an int result,
    errno saved for get_errno() after each call."""
    _flags_ = _ctypes.FUNCFLAG_CDECL | _ctypes.FUNCFLAG_USE_ERRNO
    _restype_ = _Int


class _Long(_ctypes._SimpleCData):     # ctypes.c_long
    _type_ = "l"


class _LongFunction(_ctypes.CFuncPtr):   # as _Function, with a long result (syscall's)
    _flags_ = _ctypes.FUNCFLAG_CDECL | _ctypes.FUNCFLAG_USE_ERRNO
    _restype_ = _Long


class _Process:
    """The process's own symbols (libc among them), as CDLL(None) opens them."""
    _handle = _ctypes.dlopen(None, os.RTLD_LOCAL)


def _function(name: str, *argtypes, kind=_Function):
    f = kind((name, _Process))
    if argtypes:
        f.argtypes = argtypes
    return f


_mount = _function("mount", _CharP, _CharP, _CharP, _ULong, _CharP)
_umount2 = _function("umount2", _CharP, _Int)
_prctl = _function("prctl", _Int, _ULong, _ULong, _ULong, _ULong)
_prlimit = _function("prlimit", _Int, _Int, _CharP, _CharP)
_syscall = _function("syscall", kind=_LongFunction)
get_errno = _ctypes.get_errno


def _string(b: bytes, what: str) -> bytes:
    if not isinstance(b, bytes):
        raise TypeError(f"{what}: bytes expected, not {type(b).__name__}")
    if b"\0" in b:
        raise ValueError(f"{what}: embedded NUL byte")
    return b


def _words(args: tuple, most: int) -> list:
    """Each argument as ctypes passes a C word: an int masked to 64 bits, None, or a
    writable buffer's bytes (a ctypes array sharing them, alive until the call returns)."""
    if len(args) > most:
        raise TypeError(f"at most {most} arguments, got {len(args)}")
    out = []
    for a in args:
        if a is None:
            out.append(None)
        elif isinstance(a, int):
            out.append(_ULong(a & 0xFFFFFFFFFFFFFFFF))
        else:
            try:
                view = memoryview(a)
            except TypeError:
                raise TypeError(f"an int, None or a writable buffer expected, not "
                                f"{type(a).__name__}") from None
            if view.readonly:
                raise BufferError("Object is not writable.")
            out.append((_Char * view.nbytes).from_buffer(a) if view.nbytes else None)
    return out


def mount(source: bytes, target: bytes, fstype: bytes, flags: int, data: bytes) -> int:
    return _mount(_string(source, "source"), _string(target, "target"),
                  _string(fstype, "fstype"), flags, _string(data, "data"))


def umount2(target: bytes, flags: int) -> int:
    return _umount2(_string(target, "target"), flags)


def prctl(option: int, *args) -> int:
    w = _words(args, 4)
    w += [0] * (4 - len(w))
    return _prctl(option, *(x if isinstance(x, int) else
                            0 if x is None else
                            x.value if isinstance(x, _ULong) else _ctypes.addressof(x)
                            for x in w))


def prlimit(pid: int, resource: int, soft: int, hard: int) -> int:
    new = soft.to_bytes(8, "little") + hard.to_bytes(8, "little")   # struct rlimit64
    return _prlimit(pid, resource, new, None)


def syscall(nr: int, *args) -> int:
    return _syscall(_Long(nr), *_words(args, 6))
