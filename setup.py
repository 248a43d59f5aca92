"""Package list for setuptools (the metadata is in pyproject.toml).

The folder ``kernels/`` installs under the import name ``compress_kernels``, so the project and
Hugging Face's unrelated ``kernels`` package install side by side; every subpackage of either
folder is found here, so none can be left out of a wheel.
"""
from setuptools import find_packages, setup

KERNELS = [name.replace("kernels", "compress_kernels", 1) for name in find_packages(include=["kernels", "kernels.*"])]

setup(
    packages=find_packages(include=["compress", "compress.*"]) + KERNELS,
    package_dir={"compress_kernels": "kernels"},
)
