"""Records where the checkout's build/lib/libgraft.so is ($BUILD/lib when
BUILD is set, as `make` sets it), so that an installed package finds the
library it was built next to (GRAFT_LIBRARY overrides)."""
import os

from setuptools import setup
from setuptools.command.build_py import build_py


class BuildPy(build_py):
    def run(self):
        super().run()
        here = os.path.dirname(os.path.abspath(__file__))
        build = os.environ.get("BUILD", "build")
        lib = os.path.join(os.path.dirname(here), build, "lib", "libgraft.so")
        target = os.path.join(self.build_lib, "graft", "_checkout.py")
        with open(target, "w") as f:
            f.write("# Written by setup.py at build time.\n")
            f.write("LIBRARY = %r\n" % lib)


setup(cmdclass={"build_py": BuildPy})
