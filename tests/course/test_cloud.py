"""A chapter opened on a free cloud notebook (Colab, Kaggle): the links and the set-up cell of nanocourse/cloud.py,
in every notebook; the cell does nothing on a normal machine; on a cloud notebook it installs the course, and pip,
resolving that install for real, keeps the torch the notebook already has."""

import importlib.metadata
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
import types
import zipfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from nanocourse import cloud

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted(cloud.NOTEBOOKS.glob("*.ipynb"))
NOTEBOOK_TORCH = "2.6.0+cu124"  # what a cloud notebook might have: older than the pin, a CUDA build


def _project() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_every_notebook_has_the_links_and_the_setup_cell_as_rendered(path):
    """`python -m nanocourse.cloud --write` puts them there; this fails until it has run after a change."""
    cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    title = "".join(cells[0]["source"]).split("\n")
    assert title[0].startswith("# ") and title[2] == cloud.links(path.name), "the title, then the links"
    assert cells[1]["id"] == cloud.SETUP_CELL_ID and cells[1]["cell_type"] == "code"
    assert "".join(cells[1]["source"]) == cloud.setup_source()
    assert not cloud.update(path, write=False), "out of date: python -m nanocourse.cloud --write"


def test_the_links_open_the_notebook_from_the_repository():
    line = cloud.links("04_hash_chains.ipynb", "https://github.com/someone/course")
    assert "(https://colab.research.google.com/github/someone/course/blob/main/notebooks/04_hash_chains.ipynb)" in line
    assert (
        "(https://kaggle.com/kernels/welcome?src="
        "https://github.com/someone/course/blob/main/notebooks/04_hash_chains.ipynb)"
    ) in line
    assert cloud.repository_url() == _project()["urls"]["Repository"]


def test_the_cloud_extra_is_the_course_without_the_jupyter_a_cloud_notebook_brings():
    extras = _project()["optional-dependencies"]
    course, cloud_extra = (set(map(str, map(Requirement, extras[name]))) for name in ("course", cloud.EXTRA))
    assert {Requirement(r).name for r in course - cloud_extra} == {"jupyterlab", "ipykernel"}
    assert cloud_extra < course


def test_the_setup_cell_installs_the_model_the_makefile_does():
    assert f"--no-deps {cloud.MODEL}" in (ROOT / "Makefile").read_text()


# A driver for the set-up cell on a normal machine: any command it would run fails the run, and nanoengine
# is made unimportable, so that only the cloud check keeps the cell quiet.
QUIET_DRIVER = """
import importlib.util, os, subprocess, sys

def refuse(*args, **kwargs):
    raise AssertionError(f"the set-up cell ran {args}")

subprocess.run = refuse
found = importlib.util.find_spec
importlib.util.find_spec = lambda name, *args: None if name == "nanoengine" else found(name, *args)
before = os.getcwd(), list(sys.path)
exec(sys.argv[1], {})
assert (os.getcwd(), list(sys.path)) == before, "the set-up cell moved the kernel"
"""


def test_the_setup_cell_does_nothing_and_prints_nothing_off_a_cloud_notebook(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KAGGLE_", "COLAB_"))}
    proc = subprocess.run(
        [sys.executable, "-c", QUIET_DRIVER, cloud.setup_source()],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, "", "")


def on_colab(monkeypatch):
    monkeypatch.setitem(sys.modules, "google.colab", types.ModuleType("google.colab"))


def on_kaggle(monkeypatch):
    monkeypatch.setenv("KAGGLE_KERNEL_RUN_TYPE", "Interactive")


def run_setup_cell(monkeypatch, workdir: Path, on_cloud) -> list[list[str]]:
    """The commands the set-up cell runs in workdir on a simulated cloud notebook where nanoengine is not
    installed; a fake git clone makes the folder it names."""
    commands = []

    def fake_run(cmd, check):
        assert check, "a failed step must stop the cell"
        commands.append(cmd)
        if cmd[:2] == ["git", "clone"]:
            (Path(cmd[-1]) / "notebooks").mkdir(parents=True)
        return subprocess.CompletedProcess(cmd, 0)

    found = importlib.util.find_spec
    monkeypatch.delenv("KAGGLE_KERNEL_RUN_TYPE", raising=False)
    monkeypatch.delitem(sys.modules, "google.colab", raising=False)
    on_cloud(monkeypatch)
    monkeypatch.setattr(subprocess, "run", fake_run)
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "nanoengine" else found(name, *a))
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.chdir(workdir)
    exec(cloud.setup_source(), {})  # noqa: S102 -- the set-up cell's own source, as a notebook runs it
    return commands


@pytest.mark.parametrize("on_cloud", [on_colab, on_kaggle])
def test_on_a_cloud_notebook_the_setup_cell_clones_and_installs_without_the_pins(
    monkeypatch, tmp_path, capsys, on_cloud
):
    clone = str(tmp_path / cloud.CLONE_DIR)
    commands = run_setup_cell(monkeypatch, tmp_path, on_cloud)
    pip = [sys.executable, "-m", "pip", "install", "-q"]
    assert commands == [
        ["git", "clone", "-q", "--depth", "1", cloud.repository_url(), clone],
        pip + ["-e", f"{clone}[{cloud.EXTRA}]"],
        pip + ["--no-deps", cloud.MODEL],
    ]
    assert not any({"-c", "--constraint", "-U", "--upgrade"} & set(cmd) for cmd in commands)
    # The imports of the cells below work in this kernel, and the chapter's relative paths resolve.
    assert sys.path[0] == clone and os.getcwd() == os.path.join(clone, "notebooks")
    assert capsys.readouterr().out.startswith("Installing the course")


def test_a_rerun_after_a_failed_install_keeps_the_clone(monkeypatch, tmp_path):
    (tmp_path / cloud.CLONE_DIR / "notebooks").mkdir(parents=True)
    commands = run_setup_cell(monkeypatch, tmp_path, on_kaggle)
    assert [cmd[:2] for cmd in commands] == [[sys.executable, "-m"]] * 2


def _strip_cloud(path: Path) -> None:
    """The chapter as it was before the set-up cell and the link line went in."""
    nb = json.loads(path.read_text(encoding="utf-8"))
    nb["cells"] = [c for c in nb["cells"] if c.get("id") != cloud.SETUP_CELL_ID]
    title = "".join(nb["cells"][0]["source"]).replace(f"\n\n{cloud.links(path.name)}", "")
    nb["cells"][0]["source"] = title.splitlines(keepends=True)
    path.write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")


def test_write_inserts_once_keeps_the_other_cells_and_replaces_an_old_link(tmp_path):
    copies = [Path(shutil.copy(path, tmp_path)) for path in NOTEBOOKS[:3]]
    for p in copies:
        _strip_cloud(p)
    before = {p.name: json.loads(p.read_text(encoding="utf-8"))["cells"] for p in copies}
    for p in copies:
        cloud.update(p, write=True, url="https://github.com/old/place")
    assert cloud.main(["--write", *map(str, copies)]) == 0
    written = {p.name: p.read_text(encoding="utf-8") for p in copies}
    assert cloud.main([*map(str, copies)]) == 0, "a second run must find nothing to change"
    for p in copies:
        cells = json.loads(written[p.name])["cells"]
        old = before[p.name]
        assert [c.get("id") for c in cells] == [old[0].get("id"), cloud.SETUP_CELL_ID] + [c.get("id") for c in old[1:]]
        assert cells[2:] == old[1:]
        title = "".join(cells[0]["source"])
        assert title.count(cloud.LINK_PREFIX) == 1 and "old/place" not in title
        assert title.replace(f"\n\n{cloud.links(p.name)}", "") == "".join(old[0]["source"])
        assert p.read_text(encoding="utf-8") == written[p.name]


def test_a_run_setup_cell_keeps_its_count_and_outputs(tmp_path):
    path = Path(shutil.copy(NOTEBOOKS[0], tmp_path))
    cloud.update(path, write=True)
    nb = json.loads(path.read_text(encoding="utf-8"))
    nb["cells"][1]["execution_count"] = 1
    path.write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    assert not cloud.update(path, write=False)


def test_check_mode_lists_a_stale_notebook_and_fails(tmp_path, capsys):
    path = Path(shutil.copy(NOTEBOOKS[0], tmp_path))
    cloud.update(path, write=True, url="https://github.com/old/place")
    assert cloud.main([str(path)]) == 1
    assert f"out of date: {path}" in capsys.readouterr().out


# pip, for real, against a notebook's torch. Offline: an empty venv with a fake torch installed, and a folder
# of fake wheels (a module and its metadata, no dependencies) at constraints.txt's pins for everything the
# set-up cell installs, torch 2.13.0 among them, so that pip would take it if the install asked for it.


def _pip_env() -> dict:
    """This machine's pip settings left out (config files, PIP_* variables: an index, a wheel folder, a
    constraint), so that pip sees the wheelhouse alone."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_") and k != "PYTHONPATH"}
    return {**env, "PIP_CONFIG_FILE": os.devnull}


def _wheel(folder: Path, name: str, version: str, files: dict[str, bytes] | None = None) -> Path:
    """A py3-none-any wheel of `name`: the given files, or an empty module of that name, and a dist-info."""
    stem = f"{re.sub(r'[-_.]+', '_', name)}-{version}"
    info = f"{stem}.dist-info"
    files = {
        **(files or {f"{stem.split('-')[0]}/__init__.py": b""}),
        f"{info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: test_cloud\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    files.setdefault(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode())
    files[f"{info}/RECORD"] = "".join(f"{path},,\n" for path in [*files, f"{info}/RECORD"]).encode()
    path = folder / f"{stem}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as zf:
        for name_in_zip, data in files.items():
            zf.writestr(name_in_zip, data)
    return path


def _setuptools_wheel(folder: Path) -> Path:
    """This environment's setuptools as a wheel, for pip's isolated build of the project (no index to fetch it)."""
    dist = importlib.metadata.distribution("setuptools")
    files = {
        str(f): f.read_binary()
        for f in dist.files
        if ".." not in f.parts and "__pycache__" not in f.parts and f.name not in ("RECORD", "INSTALLER")
    }
    return _wheel(folder, "setuptools", dist.version, files)


def _pins() -> dict[str, str]:
    lines = (ROOT / "constraints.txt").read_text().splitlines()
    reqs = [Requirement(line.split("#")[0]) for line in lines if line.strip() and not line.startswith("#")]
    return {r.name: str(r.specifier).removeprefix("==") for r in reqs}


def _cell_installs() -> set[str]:
    """What the set-up cell asks pip for, as pyproject.toml declares it, with the markers applied here."""
    project = _project()
    reqs = map(Requirement, project["dependencies"] + project["optional-dependencies"][cloud.EXTRA])
    return {r.name for r in reqs if r.marker is None or r.marker.evaluate()}


@pytest.fixture(scope="module")
def notebook_env(tmp_path_factory):
    """(python, wheelhouse): a venv holding a notebook's torch, and the wheels pip may take."""
    if importlib.util.find_spec("setuptools") is None:
        pytest.skip("setuptools is not in this environment, so pip cannot build the project offline")
    root = tmp_path_factory.mktemp("cloud_pip")
    wheelhouse = root / "wheels"
    wheelhouse.mkdir()
    pins = _pins()
    for name in _cell_installs() | {"triton"}:
        _wheel(wheelhouse, name, pins[name])
    _wheel(wheelhouse, *cloud.MODEL.split("=="))
    _setuptools_wheel(wheelhouse)
    subprocess.run([sys.executable, "-m", "venv", root / "venv"], check=True, timeout=120)
    python = str(root / "venv" / "bin" / "python")
    torch = _wheel(root, "torch", NOTEBOOK_TORCH)
    subprocess.run(
        [python, "-m", "pip", "install", "-q", "--no-index", "--no-deps", torch],
        env=_pip_env(),
        check=True,
        timeout=120,
    )
    return python, wheelhouse


def _dry_run(notebook_env, command: list[str], tmp_path: Path, *extra: str) -> dict[str, str]:
    """{name: version} that pip, run as the set-up cell runs it in the venv, would install."""
    python, wheelhouse = notebook_env
    report = tmp_path / "report.json"
    cmd = [
        python,
        *command[1:],
        *extra,
        "--dry-run",
        "--report",
        str(report),
        "--no-index",
        "--find-links",
        str(wheelhouse),
    ]
    proc = subprocess.run(cmd, env=_pip_env(), capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return {i["metadata"]["name"]: i["metadata"]["version"] for i in json.loads(report.read_text())["install"]}


@pytest.fixture
def cell_pip_commands(monkeypatch, tmp_path):
    """The set-up cell's pip commands, as it runs them on Kaggle, with this checkout in place of the clone."""
    clone = str(tmp_path / cloud.CLONE_DIR)
    commands = run_setup_cell(monkeypatch, tmp_path, on_kaggle)
    monkeypatch.undo()
    return [[arg.replace(clone, str(ROOT)) for arg in cmd] for cmd in commands if cmd[1:3] == ["-m", "pip"]]


def test_pip_keeps_the_notebooks_torch_and_would_replace_it_under_the_pins(notebook_env, cell_pip_commands, tmp_path):
    course, model = cell_pip_commands
    installs = _dry_run(notebook_env, course, tmp_path)
    assert "torch" not in installs, f"pip would replace the notebook's torch {NOTEBOOK_TORCH}: {installs}"
    assert set(installs) == _cell_installs() - {"torch"} | {"nanoengine"}
    assert _dry_run(notebook_env, model, tmp_path) == dict([cloud.MODEL.split("==")])
    # What `make setup` does, -c constraints.txt, would take the pinned torch instead: so the check above can fail.
    pinned = _dry_run(notebook_env, course, tmp_path, "-c", str(ROOT / "constraints.txt"))
    assert pinned.get("torch") == _pins()["torch"]
