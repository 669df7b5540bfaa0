"Fixtures shared by the test modules."
import pytest
import torch


@pytest.fixture
def one_thread():
    "One torch thread (tiny tensors: extra threads only spin on a shared CPU); thread count and default dtype restored after."
    threads, dtype = torch.get_num_threads(), torch.get_default_dtype()
    torch.set_num_threads(1)
    try: yield
    finally: torch.set_num_threads(threads); torch.set_default_dtype(dtype)
