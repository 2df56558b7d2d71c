"""`pip install ./python` into a fresh venv gives a package that finds the
checkout's libgraft.so with no environment variable set; `pip install .` of
the repository root compiles its own and bundles it (test_sdist.py installs
the sdist the same setup.py makes and runs a heal with it)."""
import os
import subprocess
import sys

from conftest import LIB_BUILD

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def test_pip_install_into_fresh_venv(tmp_path):
    venv = tmp_path / "venv"
    # Debian's python3 with its packages, as scripts/python-env.sh makes it,
    # so the install needs no network (setuptools, cffi and numpy are there).
    subprocess.run(["/usr/bin/python3", "-m", "venv", "--system-site-packages", str(venv)],
                   check=True)
    py = str(venv / "bin" / "python")
    subprocess.run([py, "-m", "pip", "install", "-q", "--disable-pip-version-check",
                    "--no-build-isolation", os.path.join(ROOT, "python")],
                   check=True, cwd=str(tmp_path), env=dict(os.environ, BUILD=LIB_BUILD))
    env = {k: v for k, v in os.environ.items() if k not in ("GRAFT_LIBRARY", "PYTHONPATH")}
    r = subprocess.run([py, "-c", "import graft, graft.torch; print(graft.library_path); "
                        "print(graft.version())"], env=env, cwd=str(tmp_path),
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    path, version = r.stdout.split()
    assert str(venv) not in path  # the checkout's library, not a copy
    assert os.path.samefile(path, os.path.join(LIB_BUILD, "lib", "libgraft.so"))
    assert version == "0.1.0"


def clean_env():
    """This process's environment without anything that points at the
    checkout or its build."""
    return {k: v for k, v in os.environ.items()
            if k not in ("GRAFT_LIBRARY", "PYTHONPATH", "BUILD", "MAKEFLAGS", "MFLAGS",
                         "MAKELEVEL")}


def venv_with(target, where):
    """A fresh venv under where (Debian's python3 with its packages, so
    nothing comes from the network) with `pip install target` done in it;
    returns the venv's python."""
    venv = where / "venv"
    subprocess.run(["/usr/bin/python3", "-m", "venv", "--system-site-packages", str(venv)],
                   check=True)
    py = str(venv / "bin" / "python")
    r = subprocess.run([py, "-m", "pip", "install", "-q", "--disable-pip-version-check",
                        "--no-build-isolation", "--no-cache-dir", "--no-index", str(target)],
                       cwd=str(where), env=clean_env(), capture_output=True, text=True,
                       timeout=900)
    assert r.returncode == 0, r.stdout + r.stderr
    return py


def run_python(py, code, where):
    """The words code prints, run by py in where with a clean environment."""
    r = subprocess.run([py, "-c", code], env=clean_env(), cwd=str(where),
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return r.stdout.split()


def site_of(py):
    return os.path.join(os.path.realpath(os.path.dirname(os.path.dirname(py))), "lib")


def test_pip_install_of_the_root_bundles_the_library(tmp_path):
    """pip builds the root in the tree: setuptools' files go to build/pip
    (setup.cfg), make's to build/pip/temp.*/libgraft, so a second install
    only relinks."""
    py = venv_with(ROOT, tmp_path)
    path, version, package_version = run_python(
        py, "import graft; print(graft.library_path, graft.version(), graft.__version__)",
        tmp_path)
    assert os.path.realpath(path).startswith(site_of(py))
    assert path.endswith("graft/libgraft.so")
    assert version == package_version
    wheel = " ".join(run_python(py, "import importlib.metadata as m; "
                                "print(m.distribution('graft').read_text('WHEEL'))", tmp_path))
    # A platform wheel (it carries machine code) for any Python 3.
    assert "Root-Is-Purelib: false" in wheel and "Tag: py3-none-linux_" in wheel
