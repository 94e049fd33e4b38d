import os
import sys

import pytest

# Tests import `harness` as a plain module.
sys.path.insert(0, os.path.dirname(__file__))
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# Hermetic: mnjit's persistent cache (on by default, in ~/.cache/mnjit) is off for the suite, whatever the
# environment says; tests of the cache give their own folders (mnjit.configure_cache). MNJIT_CACHE_DIR is left
# alone: the fast path's compiled extension lives there, built once.
os.environ["MNJIT_CACHE"] = "off"


@pytest.fixture
def cache(tmp_path):
    """A persistent cache folder of the test's own, given to mnjit; the suite's setting (off) again after."""
    import mnjit

    path = tmp_path / "cache"
    mnjit.configure_cache(path)
    yield path
    mnjit.configure_cache(True)  # back to the environment's: off (above)
