"""setuptools entry point: only here because cffi_modules and ext_modules cannot be declared in
pyproject.toml.

Two native modules are built from src/logstore/_native/: the cffi core (``_lib``: every parser,
the appender, CRC32C, the indexes) and a small CPython extension (``_records``: Record objects
built in C from the core's decoded rows, and reads of one record), with the same compiler flags (build_native.py reads
LOGSTORE_SANITIZE and LOGSTORE_DEBUG for both).
"""

import importlib.util
import pathlib

from setuptools import Extension, setup

NATIVE = pathlib.Path("src/logstore/_native")
_spec = importlib.util.spec_from_file_location("build_native", NATIVE / "build_native.py")
build_native = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(build_native)

setup(
    cffi_modules=["src/logstore/_native/build_native.py:ffibuilder"],
    ext_modules=[
        Extension(
            "logstore._native._records",
            sources=[str(NATIVE / "pyrecords.c"), str(NATIVE / "pypoint.c"), str(NATIVE / "pyappend.c")],
            include_dirs=[str(NATIVE)],
            extra_compile_args=build_native.extension_compile_args(),
            extra_link_args=build_native.link_args(),
        )
    ],
)
