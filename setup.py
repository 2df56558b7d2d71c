"""`pip install .` of the repository (or of an sdist made from it): compiles
libgraft.so with the project's Makefile, into a build directory inside
setuptools' build tree, and bundles it in the package as graft/libgraft.so,
so that nothing of the checkout is needed once the package is installed
(python/README.md, "Install"). pyproject.toml holds the metadata."""
import os
import shutil
import subprocess

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.command.egg_info import egg_info

try:  # setuptools >= 70.1 has its own; Debian 12's setuptools 66 uses wheel's
    from setuptools.command.bdist_wheel import bdist_wheel
except ImportError:
    from wheel.bdist_wheel import bdist_wheel

HERE = os.path.dirname(os.path.abspath(__file__))
# pkg-config name -> the Debian package that provides it (scripts/deps.sh).
PKG_CONFIG_DEBIAN = {
    "ucx": "libucx-dev",
    "libcurl": "libcurl4-openssl-dev",
    "libprotobuf-c": "libprotobuf-c-dev",
    "libzstd": "libzstd-dev",
    "libxxhash": "libxxhash-dev",
    "jansson": "libjansson-dev",
    "libcrypto": "libssl-dev",
}
TOOLS_DEBIAN = {"make": "make", "cc": "build-essential", "pkg-config": "pkg-config",
                "protoc-c": "protobuf-c-compiler"}


def _missing_dependencies(env):
    """The Debian packages missing for `make`, found the way the Makefile
    looks (it asks pkg-config quietly, so a missing one would otherwise show
    up as a compiler error about a header)."""
    missing = []
    tools = {"make": env.get("MAKE", "make"), "cc": env.get("CC", "cc"),
             "pkg-config": env.get("PKG_CONFIG", "pkg-config"),
             "protoc-c": env.get("PROTOC_C", "protoc-c")}
    for name, tool in tools.items():
        if shutil.which(tool.split()[0]) is None:
            missing.append(TOOLS_DEBIAN[name])
    if shutil.which(tools["pkg-config"].split()[0]) is not None:
        for pc, deb in PKG_CONFIG_DEBIAN.items():
            if pc == "ucx" and env.get("UCX_PREFIX"):
                continue  # the Makefile takes UCX from UCX_PREFIX then
            r = subprocess.run([tools["pkg-config"], "--exists", pc], env=env)
            if r.returncode != 0:
                missing.append(deb)
    return missing


def compile_library(build_temp):
    """Runs `make <build>/lib/libgraft.so` in the source tree with BUILD
    inside build_temp; returns the library's path."""
    build = os.path.join(os.path.abspath(build_temp), "libgraft")
    target = os.path.join(build, "lib", "libgraft.so")
    # An outer make's jobserver does not reach this one, and SAN/TSAN from
    # the environment would make a library Python cannot dlopen.
    env = {k: v for k, v in os.environ.items()
           if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL", "BUILD")}
    missing = _missing_dependencies(env)
    if missing:
        raise RuntimeError(
            "graft: cannot compile libgraft.so: missing build dependencies; as root run "
            "`apt-get install %s` (or the whole list: sh scripts/deps.sh in a checkout)"
            % " ".join(sorted(set(missing))))
    # A symbol left undefined (a source file missing from an sdist, say)
    # fails the link here rather than `import graft` later.
    env["LDFLAGS"] = (env.get("LDFLAGS", "") + " -Wl,--no-undefined").strip()
    jobs = os.environ.get("GRAFT_MAKE_JOBS") or str(os.cpu_count() or 1)
    cmd = [env.get("MAKE", "make"), "-C", HERE, "-j" + jobs, "SAN=0", "TSAN=0",
           "BUILD=" + build, target]
    print("graft: compiling libgraft.so: %s" % " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True, env=env)
    return target


class BuildPy(build_py):
    """The package's modules, then libgraft.so built and copied next to
    them (graft/_lib.py loads graft/libgraft.so before anything else but
    GRAFT_LIBRARY)."""

    def run(self):
        super().run()
        if getattr(self, "editable_mode", False):
            return  # an editable install loads the checkout's build (python/graft/_lib.py)
        build_temp = self.get_finalized_command("build").build_temp
        lib = compile_library(build_temp)
        target = os.path.join(self.build_lib, "graft", "libgraft.so")
        self.copy_file(lib, target, preserve_mode=True)

    def get_outputs(self, include_bytecode=1):
        return super().get_outputs(include_bytecode) + [
            os.path.join(self.build_lib, "graft", "libgraft.so")]


class EggInfo(egg_info):
    """The file list made afresh from MANIFEST.in each time: setuptools
    otherwise adds every file a previous run's SOURCES.txt listed, so a
    file dropped from MANIFEST.in would stay in the sdist of this tree."""

    def find_sources(self):
        manifest = os.path.join(self.egg_info, "SOURCES.txt")
        if os.path.exists(manifest):
            os.remove(manifest)
        super().find_sources()


class BdistWheel(bdist_wheel):
    """A platform wheel (the bundled library is x86-64/aarch64 Linux code)
    for any Python 3: the binding is cffi's ABI mode, no extension module."""

    def finalize_options(self):
        super().finalize_options()
        self.root_is_pure = False

    def get_tag(self):
        _, _, plat = super().get_tag()
        return "py3", "none", plat


setup(cmdclass={"build_py": BuildPy, "egg_info": EggInfo, "bdist_wheel": BdistWheel})
