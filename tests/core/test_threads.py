"""The extension's parallel loops run on torch's threads.

at::parallel_for is an inline template over torch's parallel backend (OpenMP in its Linux wheels): an
extension compiled without OpenMP runs every parallel_for of its own on one thread whatever
torch.set_num_threads says, and --threads 2 silently measures one thread."""
import os

import pytest
import torch

from specswap._core import _C


@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="needs two CPUs")
def test_parallel_for_uses_torch_thread_count():
    previous = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        assert _C.parallel_threads_used(8) == 1
        torch.set_num_threads(2)
        assert _C.parallel_threads_used(8) == 2
    finally:
        torch.set_num_threads(previous)
