import os
import sys

# Tests import `harness` as a plain module.
sys.path.insert(0, os.path.dirname(__file__))
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# Hermetic: mnjit's persistent cache (on by default, in ~/.cache/mnjit) is off for the suite, whatever the
# environment says; tests of the cache give their own folders (mnjit.configure_cache). MNJIT_CACHE_DIR is left
# alone: the fast path's compiled extension lives there, built once.
os.environ["MNJIT_CACHE"] = "off"
