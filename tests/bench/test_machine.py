"""Every CPU benchmark records the machine it ran on (bench/machine.py): its ratios move with the CPU, so a number is
quoted with the CPU that produced it."""

import ast
from pathlib import Path

import pytest

from bench.machine import machine_info

BENCH = Path(__file__).resolve().parents[2] / "bench"
# Scripts that write results but measure no CPU: the GPU's name is their machine, or they compile for named targets.
NOT_CPU = {
    "attention.py": "records the GPU's name",
    "kernels_offline.py": "compiles for named GPU targets",
    "notebooks_cuda.py": "runs nbval on a GPU and keeps its log",
}


def test_machine_info_names_the_cpu_its_cores_and_vector_extensions():
    machine = machine_info()
    assert machine["cpu"] and machine["cpu_count"] >= 1 and isinstance(machine["vector_extensions"], list)
    assert {"platform", "python", "torch_cpu_capability"} <= machine.keys()


@pytest.mark.parametrize(
    "script", sorted(p.name for p in BENCH.glob("*.py") if "results" in p.read_text() and p.name not in NOT_CPU)
)
def test_every_cpu_benchmark_records_machine_info(script):
    tree = ast.parse((BENCH / script).read_text())
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and getattr(n.func, "id", None) == "machine_info"]
    assert calls, f'bench/{script} writes results without recording machine_info() under "machine"'
