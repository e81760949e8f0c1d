"""cffi build script for logstore's C core (API mode).

Run by setuptools through ``cffi_modules`` when the package is installed; it compiles the sources
listed below into the extension ``logstore._native._lib``. ``logstore.h`` is both the cdef and the
header every C file includes, so the compiler checks each definition against what Python sees.

Environment:
    LOGSTORE_SANITIZE=1   build with AddressSanitizer and UndefinedBehaviorSanitizer.
    LOGSTORE_DEBUG=1      build with -O0 -g.
"""

from __future__ import annotations

import os
import pathlib

from cffi import FFI

HERE = pathlib.Path(__file__).resolve().parent
SOURCES = ["crc32c.c", "varint.c", "batch.c", "scan.c", "index.c", "appender.c", "offsetmap.c", "shared.c", "murmur2.c", "columns.c", "arena.c", "flexcheck.c"]


def _cdef_text() -> str:
    return (HERE / "logstore.h").read_text(encoding="utf-8")


def _compile_args() -> list[str]:
    args = ["-std=c11", "-Wall", "-Wextra", "-Werror"]
    if os.environ.get("LOGSTORE_DEBUG"):
        args += ["-O0", "-g"]
    else:
        args += ["-O3"]
    if os.environ.get("LOGSTORE_SANITIZE"):
        args += ["-fsanitize=address,undefined", "-fno-omit-frame-pointer", "-fno-sanitize-recover=all"]
    return args


def extension_compile_args() -> list[str]:
    """Flags for the CPython extension ``_records``: the core's, in C11 with GNU extensions
    (Python.h needs them) and without -Wcast-function-type noise from METH_FASTCALL tables."""
    return [("-std=gnu11" if a == "-std=c11" else a) for a in _compile_args()] + ["-Wno-cast-function-type"]


def link_args() -> list[str]:
    if os.environ.get("LOGSTORE_SANITIZE"):
        return ["-fsanitize=address,undefined"]
    return []


ffibuilder = FFI()
ffibuilder.cdef(_cdef_text())
ffibuilder.set_source(
    "logstore._native._lib",
    '#include <stdint.h>\n#include <stddef.h>\n#include "logstore.h"\n',
    sources=[str((HERE / s).relative_to(pathlib.Path.cwd())) if (HERE / s).is_relative_to(pathlib.Path.cwd()) else str(HERE / s) for s in SOURCES],
    include_dirs=[str(HERE)],
    extra_compile_args=_compile_args(),
    extra_link_args=link_args(),
)

if __name__ == "__main__":
    ffibuilder.compile(verbose=True)
