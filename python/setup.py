"""Marks the gac wheel as platform-specific: it carries the extension modules
that CMake built (see pyproject.toml). Everything else is in pyproject.toml."""

from setuptools import Distribution, setup


class _BinaryDistribution(Distribution):
    def has_ext_modules(self) -> bool:
        return True


setup(distclass=_BinaryDistribution)
