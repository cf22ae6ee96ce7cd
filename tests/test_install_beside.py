"""trident-flows installs beside a user's own stack, and constraints.lock agrees with pyproject.toml.

- The lock (the exact versions CI and the demo install) pins every package with ``==``, leaves the
  project out, and each of its versions lies in pyproject.toml's range for that package.
- Slow (``make test-slow``): a fresh virtual environment that already holds other releases of
  Prefect and pandas than the lock's (a user's stack) gets trident-flows with its core
  dependencies; pip keeps the user's Prefect and pandas, ``pip check`` passes, and the installed
  package imports and its CLI answers ``--help``. It downloads and installs the core dependencies
  (Ray, Prefect, pyarrow, scipy, ...) into a temporary directory that is removed afterwards; pip's
  wheel cache is used, so a second run is quicker.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[1]
LOCK = ROOT / "constraints.lock"

# The user's stack: releases of Prefect and pandas other than the lock's, within pyproject.toml's
# ranges (another patch release of each).
USER_STACK = {"prefect": "3.9.0", "pandas": "3.1.0"}
INTEGRATION_MODULES = ("trident_flows.flows.document_curation", "trident_flows.flows.trident_sidecar", "trident_flows.flows.plan_cluster",
                       "trident_flows.blocks", "trident_flows.ray_data")


def _lock() -> dict[str, str]:
    pins: dict[str, str] = {}
    for line in LOCK.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        req = Requirement(line)
        spec = list(req.specifier)
        assert len(spec) == 1 and spec[0].operator == "==" and not req.extras and req.marker is None, f"not an exact pin: {line!r}"
        name = canonicalize_name(req.name)
        assert name not in pins, f"{req.name} pinned twice in {LOCK.name}"
        pins[name] = spec[0].version
    return pins


def _requirements(extras: bool = True) -> list[Requirement]:
    """pyproject.toml's requirements: the core dependencies, and those of every extra with ``extras``."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    lines = list(project["dependencies"]) + ([r for extra in project["optional-dependencies"].values() for r in extra] if extras else [])
    return [Requirement(line) for line in lines]


def test_the_lock_pins_every_package_within_pyproject_ranges_and_leaves_out_the_project():
    pins = _lock()
    assert "trident-flows" not in pins
    assert len(pins) > 100  # the whole environment, not only the direct dependencies
    for req in _requirements():
        name = canonicalize_name(req.name)
        assert name in pins, f"{req.name} is a dependency in pyproject.toml but not pinned in {LOCK.name}"
        assert req.specifier.contains(pins[name], prereleases=True), (
            f"{LOCK.name} pins {req.name}=={pins[name]}, outside pyproject.toml's {req}")


def test_the_user_stack_of_the_slow_test_differs_from_the_lock_and_lies_within_the_ranges():
    pins = _lock()
    core = {canonicalize_name(r.name): r for r in _requirements(extras=False)}
    for name, version in USER_STACK.items():
        assert version != pins[name], f"the user's {name} must be another release than the lock's"
        assert core[name].specifier.contains(version), f"{name}=={version} is outside pyproject.toml's {core[name]}"


def _run(args: list[str], cwd: Path, env: dict[str, str], timeout: float = 1800) -> str:
    proc = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"{' '.join(args)} exited {proc.returncode}:\n{out[-6000:]}"
    return out


def _copy_project(dest: Path) -> None:
    """The files a build of the package reads, copied so that the build leaves the working tree alone."""
    dest.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, dest / name)
    for licence in ROOT.glob("LICEN[CS]E*"):
        shutil.copy2(licence, dest / licence.name)
    shutil.copytree(ROOT / "trident_flows", dest / "trident_flows", ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info"))


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_installs_beside_other_releases_of_prefect_and_pandas_and_keeps_them():
    pip_version = _lock()["pip"]
    with tempfile.TemporaryDirectory(prefix="trident-install-beside-") as tmp:
        tmp = Path(tmp)
        env = {k: v for k, v in os.environ.items() if k not in {"VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME", "PIP_NO_CACHE_DIR", "PIP_REQUIRE_VIRTUALENV"}}
        env["PREFECT_HOME"] = str(tmp / "prefect-home")  # Prefect's import writes its home; keep it in here
        env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
        venv, src, cwd = tmp / "venv", tmp / "src", tmp / "cwd"
        cwd.mkdir()  # an empty working directory, so that `import trident_flows` can only find the installed package
        _run([sys.executable, "-m", "venv", str(venv)], cwd, env)
        py = str(venv / "bin" / "python")
        _run([py, "-m", "pip", "install", "-q", f"pip=={pip_version}"], cwd, env)
        # the user's stack, installed first
        _run([py, "-m", "pip", "install", "-q"] + [f"{name}=={version}" for name, version in USER_STACK.items()], cwd, env)
        _copy_project(src)
        _run([py, "-m", "pip", "install", "-q", str(src)], cwd, env)

        versions = _run([py, "-c", "import importlib.metadata as m, json; "
                         f"print(json.dumps({{n: m.version(n) for n in {sorted(USER_STACK)!r}}}))"], cwd, env)
        assert json.loads(versions.strip().splitlines()[-1]) == USER_STACK, f"pip replaced the user's releases: {versions}"
        _run([py, "-m", "pip", "check"], cwd, env)
        where = _run([py, "-c", "import trident_flows; print(trident_flows.__file__)"], cwd, env).strip().splitlines()[-1]
        assert Path(where).is_relative_to(venv), f"imported {where}, not the installed package"
        # the modules that use Prefect and Ray Data, against the user's releases (without the models extra)
        _run([py, "-c", "import " + ", ".join(INTEGRATION_MODULES)], cwd, env)
        help_text = _run([str(venv / "bin" / "trident-flows"), "--help"], cwd, env)
        assert "Usage" in help_text and "trident-flows" in help_text, help_text
