"""Shared pytest fixtures of the qhead Python tests (keep small and generic)."""

import os
import pathlib

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

REPO = pathlib.Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures"


@pytest.fixture(scope="session")
def fixtures_dir():
    """tests/fixtures of the repository (compressed-tensors, GPTQ and GGUF fixtures)."""
    return FIXTURES


@pytest.fixture
def keep_threads():
    """torch's and qhead's CPU thread counts restored after the test (for code that sets them)."""
    import torch

    import qhead

    saved = (torch.get_num_threads(), qhead.num_threads())
    yield
    torch.set_num_threads(saved[0])
    qhead.set_num_threads(saved[1])


def cuda_available():
    """True when torch sees a GPU and qhead was built with CUDA."""
    try:
        import torch
    except ImportError:
        return False
    import qhead

    return torch.cuda.is_available() and qhead.cuda_available()


requires_cuda = pytest.mark.skipif(not cuda_available(), reason="needs a CUDA GPU and a CUDA build of qhead")
