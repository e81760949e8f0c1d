"""setuptools entry point: only here because cffi_modules cannot be declared in pyproject.toml."""

from setuptools import setup

setup(cffi_modules=["src/logstore/_native/build_native.py:ffibuilder"])
