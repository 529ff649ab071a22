import pytest

from alignment.cpu_kernels import build


@pytest.fixture(scope="module")
def lib():
    """The compiled kernel library; the test skips where none can be built (no C++ compiler)."""
    module = build.load_kernels()
    if module is None:
        pytest.skip(f"no kernel library on this machine ({build._state['why']})")
    return module
