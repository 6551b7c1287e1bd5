"""Fakes 8 CPU devices before JAX starts (pyproject.toml puts the repository root on the path).

The tests compile hundreds of small programs and run each a few times, so they compile for
speed of compiling (tests/support/train_runs.py FAST_COMPILE), here and in every train.py the tests
start. It changes how fast the code runs, not what it computes.

Each test process keeps a JAX compilation cache of its own, and another for the train.py and
sample.py it starts (tests/support/train_runs.py clean_env): many tests compile the same programs again
(the same model for another layout's reference, the same tiny run resumed), and a hit is the same
executable, so the same numbers bit for bit."""

import atexit
import os
import shutil
import tempfile

from tests.support.train_runs import COMPILE_CACHE, FAST_COMPILE  # imports no JAX: the flags still apply

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + f" {FAST_COMPILE}"
                           " --xla_force_host_platform_device_count=8").strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402  (must come after XLA_FLAGS)
import pytest  # noqa: E402

# Fresh for each pytest run and each worker (nothing outlives the run; two workers never write
# one file); set before the first compile, which is when JAX opens the cache. This process and
# the runs it starts keep separate folders: JAX leaves the fake-device count out of the cache
# key, so a program compiled here for 4 of this process's 8 devices would otherwise be handed
# to a train.py that has 4 in all (a train step crashed so, once, inside XLA).
_CACHE = tempfile.mkdtemp(prefix="ringstripe-test-compile-cache-")
atexit.register(shutil.rmtree, _CACHE, ignore_errors=True)
os.environ[COMPILE_CACHE] = os.path.join(_CACHE, "started_runs")
jax.config.update("jax_compilation_cache_dir", os.path.join(_CACHE, "this_process"))
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)

# The CPU's count: tests/parallel/test_pallas_gpu.py runs on a GPU machine with JAX_PLATFORMS=cuda,cpu,
# where the GPU is the default backend and the 8 fake CPU devices are there beside it.
assert jax.device_count("cpu") == 8, f"expected 8 fake CPU devices, got {jax.devices('cpu')}"


# Each tier runs its files on two workers (pytest-xdist, --dist loadfile: tests/tiers.py), a
# file at a time, in the order collected (--no-loadscope-reorder: xdist would otherwise put the
# files with the most tests first). The files that take longest in their tier go first, so that
# a run does not end with one worker busy on a long file and the other idle (longest-first
# scheduling; measured with --durations). A file's place counts only among the files of its
# tier. (A third worker on the 2 cores was measured no faster: 14:57 against 15:38.)
LONGEST_FIRST = (
    # the programs tier
    "test_bucket.py", "test_checkpoints.py", "test_train.py", "test_figures.py",
    "test_init_from.py", "test_faults.py", "test_sample.py", "test_launch.py",
    # the fast and sweeps tiers
    "test_attention.py", "test_hf.py", "test_linear_attention.py", "test_moe.py",
    "test_parallel_decode.py", "test_mla_parallel.py", "test_bad_input.py", "test_mamba.py",
    "test_model.py", "test_attention_pallas.py", "test_model_memory.py")


@pytest.fixture(scope="session")
def token_cache(tmp_path_factory):
    """One tokenizer and token cache (data.cache_dir) for the tiny train.py runs of every file a
    worker runs: each run keys its token cache by its data settings, so a run with other ones
    adds its own beside it."""
    return str(tmp_path_factory.mktemp("token_cache"))


def pytest_collection_modifyitems(session, config, items):
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))
