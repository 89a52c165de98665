"""bench/notebooks_cuda.py reruns, alone, a notebook whose kernel died at start-up beside the others (the GPU
pass itself runs on a lent GPU; its log is bench/results/notebooks_cuda_<gpu>.txt)."""

from bench.notebooks_cuda import rerun_code, startup_deaths

# The -rfE summary of the H200 run in which notebook 06's kernel died before it answered kernel_info.
DIED = [
    "ERROR notebooks/06_prefix_caching.ipynb::Cell 0 - RuntimeError: Kernel died b...\n",
    "ERROR notebooks/06_prefix_caching.ipynb::Cell 3 - RuntimeError: Kernel died b...\n",
]
CELL_FAILED = ["FAILED notebooks/02_paging.ipynb::Cell 4\n"]


def test_only_a_kernel_that_died_at_start_up_is_run_again():
    assert startup_deaths(["273 passed, 24 errors in 95.89s\n", *DIED]) == ["notebooks/06_prefix_caching.ipynb"]
    assert startup_deaths(CELL_FAILED) == []
    # A kernel that dies later, in a cell's own run, is that cell's failure, not a start-up race.
    assert startup_deaths(["ERROR notebooks/07_scheduler.ipynb::Cell 5 - RuntimeError: Kernel died\n"]) == []


def test_the_rerun_decides_only_when_start_up_deaths_were_the_only_failures():
    assert rerun_code(1, DIED, ["notebooks/06_prefix_caching.ipynb"], 0) == 0
    assert rerun_code(1, DIED, ["notebooks/06_prefix_caching.ipynb"], 1) == 1
    assert rerun_code(1, DIED + CELL_FAILED, ["notebooks/06_prefix_caching.ipynb"], 0) == 1
