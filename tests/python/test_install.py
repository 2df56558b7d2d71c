"""`pip install ./python` into a fresh venv gives a package that finds the
checkout's libgraft.so with no environment variable set."""
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
