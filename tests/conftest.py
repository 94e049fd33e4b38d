import os
import sys

# Tests import `harness` as a plain module.
sys.path.insert(0, os.path.dirname(__file__))
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# Hermetic: mnjit's persistent cache (on by default, in ~/.cache/mnjit) is off for the suite, whatever the
# environment says; tests of the cache give their own folders (mnjit.configure_cache, or the variable).
os.environ["MNJIT_CACHE_DIR"] = "off"
