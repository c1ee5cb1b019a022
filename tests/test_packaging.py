"""Packaging: `import ectable` works from a plain checkout and from the wheel alike, and the wheel holds every
module of the source tree."""
import pathlib
import shutil
import site
import subprocess
import sys
import zipfile

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
SOURCES = ("ectable", "transport")

USE = """
import sys
import ectable, ectable.transport, ectable.testing.sim
assert ectable.__file__.startswith(sys.argv[1]) and ectable.transport.__file__.startswith(sys.argv[1]), \\
    (ectable.__file__, ectable.transport.__file__)
with ectable.LocalCluster(nodes=5, processes=False) as cluster:
    client = cluster.connect()
    client.create_table("t", 10, 2)
    print(client.get("t", [[1, 2]]).shape)
"""


def _copy_tree(dest: pathlib.Path) -> None:
    for name in SOURCES + ("setup.cfg", "pyproject.toml", "README.md"):
        source = ROOT / name
        if source.is_dir():
            shutil.copytree(source, dest / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy(source, dest / name)


def _run_isolated(path: pathlib.Path, target: str) -> str:
    """Run USE with `path` first on sys.path and no site hooks (no editable install), the dependencies found
    in this interpreter's site-packages."""
    boot = (f"import sys; sys.path[:0] = [{str(path)!r}]; sys.path += {site.getsitepackages()!r}; "
            f"sys.argv = ['use', {target!r}]; exec(compile({USE!r}, 'use', 'exec'))")
    run = subprocess.run([sys.executable, "-S", "-c", boot], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-3000:]
    return run.stdout.strip()


def test_import_from_a_plain_checkout(tmp_path):
    _copy_tree(tmp_path)
    assert _run_isolated(tmp_path, str(tmp_path)) == "(1, 2, 2)"


@pytest.mark.timeout(300)
def test_the_wheel_holds_every_module_and_imports(tmp_path):
    tree = tmp_path / "tree"
    tree.mkdir()
    _copy_tree(tree)
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path / "dist"),
                            str(tree)], capture_output=True, text=True, timeout=240)
    assert build.returncode == 0, build.stderr[-3000:]
    (wheel,) = (tmp_path / "dist").glob("ectable-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    expected = {f"ectable/{p.relative_to(ROOT / 'ectable').as_posix()}" for p in (ROOT / "ectable").rglob("*.py")}
    expected |= {f"ectable/transport/{p.relative_to(ROOT / 'transport').as_posix()}"
                 for p in (ROOT / "transport").rglob("*.py")}
    assert expected <= names, f"missing from the wheel: {sorted(expected - names)}"
    unpacked = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(unpacked)
    assert _run_isolated(unpacked, str(unpacked)) == "(1, 2, 2)"
