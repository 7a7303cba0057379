"""Packages: the code under bundler/ and runtime_py/, plus two data folders of the repo.

schemas/ ships as `runtime_py.schema_files` and families/ as `bundler.family_data` (see
pyproject.toml's package-dir), so that an installed wheel has them too. They are added
here because package discovery only finds folders under the package's own path.
"""

from setuptools import find_packages, setup

setup(packages=find_packages(include=["bundler", "bundler.*", "runtime_py", "runtime_py.*"])
      + ["runtime_py.schema_files", "bundler.family_data"])
