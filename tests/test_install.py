"""The install entry points agree on the oldest Python (the pinned torch has no wheels
for older ones), and ``make`` refuses an older ``python3`` with one line instead of a
pip resolution error several minutes in."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def makefile_min_python() -> str:
    return re.search(r"^MIN_PYTHON := (\S+)$", (REPO / "Makefile").read_text(), re.M).group(1)


def test_the_makefile_and_pyproject_name_the_same_oldest_python():
    requires = re.search(r'^requires-python = "(.+)"$', (REPO / "pyproject.toml").read_text(), re.M).group(1)
    assert requires == f">={makefile_min_python()}"
    assert "torch==2.13.0" in (REPO / "constraints.txt").read_text().splitlines()  # the pin the bound is for


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
@pytest.mark.parametrize("version, refused", [("3.9.18", True), (None, False)])
def test_make_refuses_a_python_older_than_the_oldest(tmp_path, version, refused):
    """A stand-in interpreter reports ``version`` (None: this one's) and, where the
    check passes, ``-m venv`` leaves a marker instead of making a virtualenv."""
    shutil.copy(REPO / "Makefile", tmp_path / "Makefile")
    fake = tmp_path / "python"
    version_info = "sys.version_info" if version is None else repr(tuple(int(x) for x in version.split(".")))
    fake.write_text(
        f"#!{sys.executable}\n"
        "import sys, platform\n"
        "args = sys.argv[1:]\n"
        "if args[:2] == ['-m', 'venv']:\n"
        "    import pathlib; (pathlib.Path(args[2]) / 'bin').mkdir(parents=True); sys.exit(0)\n"
        f"version_info = {version_info}\n"
        "sys.version_info, platform.python_version = version_info, lambda: '.'.join(map(str, version_info[:3]))\n"
        "exec(args[1])\n"
    )
    fake.chmod(0o755)
    result = subprocess.run(
        ["make", "--no-print-directory", ".venv/bin/python", f"PYTHON={fake}"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    if refused:
        assert result.returncode != 0
        errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
        assert len(errors) == 1
        assert f"is Python {version}, the package needs >= {makefile_min_python()}" in errors[0]
        assert not (tmp_path / ".venv").exists()
    else:
        assert result.returncode == 0, result.stderr
        assert (tmp_path / ".venv" / "bin").is_dir()
