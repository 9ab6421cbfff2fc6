"""Test setup: the JAX platform and host devices, set before anything imports JAX.

Every run uses the CPU backend with 8 host devices (sharding tests), except a run that selects
the GPU tests (`pytest -m gpu`) on a machine with an NVIDIA device: JAX then picks its default
backend (the GPU where JAX's CUDA plugin is installed). `XLSCALE_TEST_PLATFORMS` overrides both
(it becomes `JAX_PLATFORMS`, e.g. `cuda,cpu`). Without a GPU backend every GPU test is skipped
with one reason saying how to run them.

A GPU run must also work on a bare JAX GPU image (no TensorFlow, seqio or gin, the project not
installed): it collects only the test modules that hold GPU tests, and the `gcs_fixtures`
plugin needs nothing but the standard library.
"""

import contextlib
import glob
import importlib.util
import os
import shutil
import sys
from pathlib import Path

import pytest

pytest_plugins = ["gcs_fixtures"]

# The repository's packages, for a checkout that is not pip-installed (a GPU image running plain
# `pytest` from the repository root); an installed copy comes first.
REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.append(str(REPO))

GPU_MARK = "gpu"
# Set to JAX_PLATFORMS's syntax to choose the platforms of a test run yourself.
PLATFORMS_ENV = "XLSCALE_TEST_PLATFORMS"
HOST_DEVICES_FLAG = "--xla_force_host_platform_device_count=8"
# The test processes' own CPU devices (`jax_num_cpu_devices`, set in-process, so it is not passed
# on): the processes a test starts (trainers, sweeps, demos, CLIs) see one device, as a user's do,
# unless the test gives them HOST_DEVICES_FLAG. A toy run partitioned eight ways on two cores
# costs about a quarter more CPU (the CPT smoke demo: 95 s of user CPU with eight, 72 s with one).
TEST_CPU_DEVICES = 8
# The suite's programs are tiny and run a few steps, so compiling them is most of its CPU time.
# Without LLVM's optimisation passes XLA:CPU compiles them faster and runs them slower: seven
# trainer test modules took 134 s instead of 206 s (2 workers, cold compilation cache), with the
# same results. XLA:CPU's newer fusion emitters cost more to compile than the loop emitters at this
# level: a tiny LLaMA trainer process (6 steps, no compilation cache) took 13.4 s of user CPU with
# them and 9.5 s without (median of 3). A test of thousands of steps keeps the default (the SLURM
# time limit's long runs). Tests only: users' jobs compile at XLA's default level.
# XLSCALE_TEST_XLA_OPTIMIZED=1 keeps the default everywhere.
FAST_COMPILE_FLAGS = (
    "--xla_backend_optimization_level=0",
    "--xla_llvm_disable_expensive_passes=true",
    "--xla_cpu_use_fusion_emitters=false",
)
FAST_COMPILE_OFF_ENV = "XLSCALE_TEST_XLA_OPTIMIZED"
COMPILE_CACHE_ENV = "XLSCALE_COMPILATION_CACHE"  # trainer.compile_cache.ENV_VAR


def fast_compile_flags() -> str:
    """FAST_COMPILE_FLAGS as XLA_FLAGS words, for a test's subprocess that sets its own XLA_FLAGS
    ('' where XLSCALE_TEST_XLA_OPTIMIZED keeps XLA's default)."""
    if os.environ.get(FAST_COMPILE_OFF_ENV, "") not in ("", "0"):
        return ""
    return " ".join(FAST_COMPILE_FLAGS)


# Plain helpers that test modules import (`from conftest import ...`) as well as the fixtures
# below: `fast_compile_flags` above, `imported_with`, `random_params`.


def imported_with(module: str, candidates) -> list[str]:
    """Which of `candidates` (module names) a fresh Python process holds after importing
    `module`, sorted: for the checks that a light module does not pull in a heavy one
    (TensorFlow, seqio, JAX), which this process, having imported them already, cannot make."""
    import subprocess

    code = (
        "import importlib, sys\n"
        f"importlib.import_module({module!r})\n"
        f"print(','.join(sorted(m for m in {tuple(candidates)!r} if m in sys.modules)))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    return [name for name in out.stdout.strip().split(",") if name]


def random_params(abstract, rng, *, scale: float = 1.0, dtype=None):
    """`abstract` (a tree of shapes and dtypes: a model's abstract parameters) filled with
    normal draws of standard deviation `scale` from the numpy generator `rng` (a
    `np.random.default_rng(seed)` or a legacy `np.random.RandomState(seed)`), as numpy arrays of
    `dtype` (by default each leaf's own). Parameters for the tests whose identities hold for any
    values, without compiling the model's initialiser (seconds on a CPU)."""
    import jax

    return jax.tree.map(
        lambda s: (scale * rng.standard_normal(s.shape)).astype(dtype or s.dtype), abstract
    )


HOW_TO_RUN = (
    "run `pytest -m gpu` on a machine with an NVIDIA GPU and JAX's CUDA plugin "
    "(pip install -e '.[gpu]'), or set XLSCALE_TEST_PLATFORMS=cuda,cpu"
)


def gpu_present() -> bool:
    """Whether this machine shows an NVIDIA GPU (a device node, or `nvidia-smi`), without
    importing JAX."""
    return bool(glob.glob("/dev/nvidia[0-9]*")) or shutil.which("nvidia-smi") is not None


def selects_gpu_tests(markexpr: str, markers: list[str]) -> bool:
    """Whether `-m markexpr` selects the GPU tests and nothing else: a test marked only `gpu`
    matches it, an unmarked test or one marked with any other single marker does not."""
    if not markexpr.strip():
        return False
    try:
        from _pytest.mark.expression import Expression

        expression = Expression.compile(markexpr)

        def selects(marks: set[str]) -> bool:
            return expression.evaluate(lambda name, **kwargs: name in marks)

    except Exception:  # another pytest: the plain `-m gpu`
        return markexpr.strip() == GPU_MARK
    others = [{name} for name in markers if name != GPU_MARK]
    return selects({GPU_MARK}) and not any(selects(marks) for marks in [set(), *others])


def _marker_names(config) -> list[str]:
    return [line.split(":")[0].split("(")[0].strip() for line in config.getini("markers")]


def pytest_configure(config):
    """Chooses the JAX platforms and the test processes' CPU devices (before any test module
    imports JAX)."""
    gpu_run = selects_gpu_tests(config.option.markexpr or "", _marker_names(config))
    config.stash[_GPU_RUN] = gpu_run
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    flags = os.environ.get("XLA_FLAGS", "").split()
    wanted = [] if gpu_run else fast_compile_flags().split()
    os.environ["XLA_FLAGS"] = " ".join([*flags, *(f for f in wanted if f not in flags)])
    if os.environ.get(PLATFORMS_ENV):
        os.environ["JAX_PLATFORMS"] = os.environ[PLATFORMS_ENV]
    elif gpu_run and gpu_present():
        os.environ.pop("JAX_PLATFORMS", None)  # JAX's default: its GPU backend if it has one
    else:
        os.environ["JAX_PLATFORMS"] = "cpu"
        config.stash[_NO_GPU] = (
            "runs without -m gpu use the CPU backend"
            if not gpu_run and gpu_present()
            else "this machine shows no NVIDIA GPU (no /dev/nvidia*, no nvidia-smi)"
        )
    if "jax" in sys.modules:  # imported by a plugin: too late to choose its platforms
        config.stash[_NO_GPU] = "JAX was imported before tests/conftest.py chose its platforms"
    given = any(f.startswith(HOST_DEVICES_FLAG.split("=")[0]) for f in flags)
    xdist_controller = config.getoption("numprocesses", None) and not hasattr(config, "workerinput")
    if not given and not xdist_controller:  # where tests run (no JAX in xdist's controller)
        import jax

        jax.config.update("jax_num_cpu_devices", TEST_CPU_DEVICES)


_GPU_RUN = pytest.StashKey[bool]()
_NO_GPU = pytest.StashKey[str]()


def pytest_ignore_collect(collection_path: Path, config):
    """In a GPU run, test modules without GPU tests are not imported: their imports (seqio,
    TensorFlow, gin) may be missing from a JAX GPU image, and they would select nothing."""
    if not config.stash.get(_GPU_RUN, False) or collection_path.suffix != ".py":
        return None
    if not collection_path.name.startswith("test_"):
        return None
    try:
        text = collection_path.read_text(encoding="utf-8")
    except OSError:
        return None
    return True if f"mark.{GPU_MARK}" not in text else None


def _why_no_gpu(config) -> str | None:
    """Why this run has no GPU backend (None: it has one)."""
    reason = config.stash.get(_NO_GPU, None)
    if reason is None:
        import jax  # here, not at the top: JAX reads JAX_PLATFORMS once, when first imported

        try:
            backend = jax.default_backend()
        except Exception as e:  # JAX_PLATFORMS names a platform that fails to start
            first = (str(e).strip().splitlines() or [type(e).__name__])[0]
            platforms = os.environ.get("JAX_PLATFORMS")
            return f"JAX could not start its backends ({first}; JAX_PLATFORMS={platforms!r})"
        if backend == "gpu":
            return None
        reason = f"JAX runs on {backend} (is JAX's CUDA plugin installed?)"
    return reason


# The test modules holding the suite's longest tests (real services, whole studies), longest
# first, from CI's `--durations`: the SLURM time limit + preemption requeue ~140 s (and four more
# tests on the module's one cluster), the MT smoke study ~105 s, the GCS store going away ~60-90
# s, the CPT smoke study ~70 s, the GCS CPT run ~55 s, the two-host setup ~55 s, the kill -9 loop
# ~50 s, the trainer runs' fixture ~40 s, COMET's side environment ~35 s, the TPU AOT compile
# ~35 s, the paper check ~21 s. Only an order: a module missing here runs all the same.
LONGEST_FIRST = (
    "test_slurm_cluster.py",
    "test_slurm_nodes.py",  # its cluster waits for the one above: right after it, on its worker
    "test_studies_mt_smoke.py",
    "test_storage_failures.py",
    "test_studies_cpt_smoke.py",
    "test_gcs_runs.py",
    "test_multihost.py",
    "test_run_integrity.py",
    "test_trainer_runs.py",
    "test_comet.py",
    "test_memory_model.py",
    "test_paper_check.py",
)
SLOW_MARK = "slow"


def longest_first(items: list) -> list:
    """`items` with whole modules reordered: those of `LONGEST_FIRST` in its order, then the other
    modules holding a `slow` test, then the rest, each module's tests in their own order.

    Why: pytest-xdist's work stealing hands each worker a contiguous part of the collection and
    moves tests from the end of a busy worker's queue to an idle one. Run first, the SLURM
    module's tests are never the moved ones, so its cluster starts once (a module split over two
    workers makes the second wait on the machine-wide cluster lock: 150 s in one 3-worker run),
    and no two-minute test (the alphabet puts the SLURM module and the smoke studies late)
    starts in a run's last minutes, when the other worker has nothing left to overlap it with.
    """
    modules: dict[str, list] = {}
    for item in items:
        modules.setdefault(item.nodeid.split("::", 1)[0], []).append(item)
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}

    def key(path: str) -> tuple[int, int]:
        name = path.rsplit("/", 1)[-1]
        if name in rank:
            return (0, rank[name])
        slow = any(item.get_closest_marker(SLOW_MARK) is not None for item in modules[path])
        return (1 if slow else 2, 0)

    return [item for path in sorted(modules, key=key) for item in modules[path]]


@pytest.hookimpl(trylast=True)  # after pytest's own reordering by fixture scope
def pytest_collection_modifyitems(config, items):
    """Runs the modules of the longest tests first (`longest_first`), and skips every GPU test,
    with one reason, where there is no GPU backend."""
    items[:] = longest_first(items)
    gpu_items = [item for item in items if item.get_closest_marker(GPU_MARK) is not None]
    if not gpu_items:
        return
    reason = _why_no_gpu(config)
    if reason is None:
        return
    skip = pytest.mark.skipif(True, reason=f"no GPU backend: {reason}; {HOW_TO_RUN}")
    for item in gpu_items:
        item.add_marker(skip, append=False)  # before the tests' own skipifs: this reason shows


@pytest.fixture(scope="session", autouse=True)
def temporary_files_in_basetemp(tmp_path_factory):
    """Points the temporary files of the processes the tests start (`TMPDIR`) into pytest's base
    temporary directory, and removes them at the session's end: a process killed on purpose (or
    ending without `atexit`) leaves TensorFlow's `__autograph_generated_file*.py` and staged
    TensorBoard directories behind, which would pile up in the system's temporary directory.
    This process's own `tempfile` directory is left alone: the tests' machine-wide locks live
    there (`slurm_cluster.LOCK_PATH`, COMET's environment), and TensorFlow removes its files at
    exit."""
    tmp = tmp_path_factory.mktemp("tmp", numbered=False)
    saved = os.environ.get("TMPDIR")
    os.environ["TMPDIR"] = str(tmp)
    yield tmp
    if saved is None:
        os.environ.pop("TMPDIR", None)
    else:
        os.environ["TMPDIR"] = saved
    shutil.rmtree(tmp, ignore_errors=True)


@pytest.fixture(scope="session", autouse=True)
def session_compilation_cache(tmp_path_factory):
    """The compilation cache of the jobs the tests run in and out of this process (trainer
    subprocesses, sweeps, demos: `trainer.compile_cache` reads `XLSCALE_COMPILATION_CACHE`) is
    the session's shared directory (`shared_cache_dir`), not the user's `~/.cache/xlscale/xla`:
    the suite neither fills the user's cache nor depends on what earlier runs left there, so its
    cost is the same on a fresh machine as on a developer's. An `XLSCALE_COMPILATION_CACHE` set
    by the caller wins (e.g. a directory kept between runs of the edit loop)."""
    saved = os.environ.get(COMPILE_CACHE_ENV)
    if saved is None:
        os.environ[COMPILE_CACHE_ENV] = os.fspath(shared_cache_dir(tmp_path_factory))
    yield os.environ[COMPILE_CACHE_ENV]
    if saved is None:
        os.environ.pop(COMPILE_CACHE_ENV, None)


@pytest.fixture
def optimized_xla(monkeypatch):
    """XLA's default optimisation for this test and the processes it starts: for a test whose
    time goes to running its steps, not compiling them (the MT smoke study's 28 runs, two at a
    time in worker processes: 144 s instead of 186 s unoptimised, cold cache)."""
    flags = [f for f in os.environ.get("XLA_FLAGS", "").split() if f not in FAST_COMPILE_FLAGS]
    monkeypatch.setenv("XLA_FLAGS", " ".join(flags))


@pytest.fixture(scope="session")
def run_quietly():
    """`run_quietly(*args, env=...) -> str`: runs `xlscale *args` in a subprocess as a user does
    (without the tests' `TF_CPP_MIN_LOG_LEVEL`), checks that it succeeds and that its terminal
    holds the project's lines only (`xlscale_cli.terminal.LINE_FORMATS`), and returns what the
    terminal showed."""
    import subprocess

    from xlscale_cli import terminal

    def run(*args, env=None):
        env = {k: v for k, v in (env or os.environ).items() if k != "TF_CPP_MIN_LOG_LEVEL"}
        cmd = [sys.executable, "-m", "xlscale_cli.main", *map(str, args)]
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
        shown = proc.stdout + proc.stderr
        assert proc.returncode == 0, shown
        assert terminal.foreign_lines(shown) == [], shown
        return shown

    return run


@pytest.fixture
def seqio_registry():
    """Empties seqio's task and mixture registries around a test, so tests never see each other's
    registrations (and never depend on import-time side effects)."""
    with SeqioState.emptied():
        yield


@pytest.fixture(scope="session")
def fixture_data(tmp_path_factory):
    """`build(langs=..., vocab_size=...) -> (corpora_dir, vocabulary)`: the UDHR fixture corpora
    and a SentencePiece vocabulary trained on them (with T5's 100 sentinel ids), built once per
    session for each `(langs, vocab_size)`."""
    from pipelines import vocab
    from pipelines.corpora.fixture import write_fixture_corpora

    corpora = write_fixture_corpora(tmp_path_factory.mktemp("data"))
    built = {}

    def build(*, langs, vocab_size):
        key = (tuple(langs), vocab_size)
        if key not in built:
            model = vocab.train_vocab(
                corpora_dir=corpora,
                langs=langs,
                out_prefix=tmp_path_factory.mktemp("v") / "v",
                vocab_size=vocab_size,
            )
            built[key] = corpora, vocab.load_vocab(model, extra_ids=100)
        return built[key]

    return build


# The languages of the corpora of the seqio task, mixture and stream tests (`six_langs`).
SIX_LANGS = ["en", "zh", "fr", "ru", "de", "ro"]


@pytest.fixture(scope="session")
def six_langs(fixture_data):
    """`(corpora_dir, vocabulary)`: the fixture corpora of `SIX_LANGS` and an 800-piece
    vocabulary of them, built once for the seqio task and mixture test modules."""
    return fixture_data(langs=SIX_LANGS, vocab_size=800)


class SeqioState:
    """Snapshot and restore of seqio's task and mixture registries, for fixtures that register
    tasks for a whole module (the function-scoped `seqio_registry` cannot serve them)."""

    @staticmethod
    def snapshot():
        """The registries' current contents."""
        import seqio

        return dict(seqio.TaskRegistry._REGISTRY), dict(seqio.MixtureRegistry._REGISTRY)

    @staticmethod
    def restore(saved):
        """Puts back what `snapshot` returned, dropping everything registered since."""
        import seqio

        seqio.TaskRegistry.reset()
        seqio.MixtureRegistry.reset()
        seqio.TaskRegistry._REGISTRY.update(saved[0])
        seqio.MixtureRegistry._REGISTRY.update(saved[1])

    @classmethod
    @contextlib.contextmanager
    def kept(cls):
        """`with seqio_state.kept(): ...`: whatever the block registers is dropped after it (the
        `snapshot` ... `restore` pair, for a block)."""
        saved = cls.snapshot()
        try:
            yield
        finally:
            cls.restore(saved)

    @classmethod
    @contextlib.contextmanager
    def emptied(cls):
        """`with seqio_state.emptied(): ...`: empty registries inside the block (no registration
        made before it, at import or by another test, shows), what they held put back after it."""
        with cls.kept():
            cls.restore(({}, {}))
            yield


@pytest.fixture(scope="session")
def seqio_state():
    """`SeqioState`: `saved = seqio_state.snapshot()` ... `seqio_state.restore(saved)`, or the
    blocks `with seqio_state.kept():` and `with seqio_state.emptied():`."""
    return SeqioState


@pytest.fixture(scope="session")
def tiny_data(tmp_path_factory):
    """Fixture corpora and a 320-piece English/French vocabulary, built once (the trainer tests
    of both families share them)."""
    from pipelines import vocab
    from pipelines.corpora.fixture import write_fixture_corpora

    root = tmp_path_factory.mktemp("xl_data")
    corpora = write_fixture_corpora(root)
    model = vocab.train_vocab(
        corpora_dir=corpora, langs=["en", "fr"], out_prefix=root / "vocab" / "tiny", vocab_size=320
    )
    return {"corpora": os.fspath(corpora), "vocab": os.fspath(model)}


# The tasks `tiny_prepared` prepares: the tiny corpora's language-modelling tasks.
TINY_PREPARED_TASKS = ("lm_en", "lm_fr")


@pytest.fixture(scope="session")
def tiny_prepared(tiny_data, tmp_path_factory):
    """`TINY_PREPARED_TASKS` prepared once from `tiny_data` (train splits in two shards,
    validation splits in one): the `PREPARED_DATA` of the trainer subprocesses whose subject is
    not seqio, which then import no TensorFlow and build no tf.data pipeline (seconds of CPU per
    process). The seqio registry is left as it was."""
    from prepared_runs import prepare_splits, prepare_train_splits, tiny_registration

    out = tmp_path_factory.mktemp("tiny_prepared")
    with SeqioState.kept():
        tiny_registration(tiny_data).register()
        prepare_train_splits(out, TINY_PREPARED_TASKS)
        prepare_splits(out, TINY_PREPARED_TASKS, split="validation", num_shards=1)
    return os.fspath(out)


# `make test` installs libtpu off the import path (`$(VENV)/libtpu-aot`, so no other process
# loads it or prints its TPU start-up warnings) and names it in XLSCALE_LIBTPU; an installed
# `jax[tpu]` works too.
LIBTPU = os.environ.get("XLSCALE_LIBTPU", "")
HAS_LIBTPU = importlib.util.find_spec("libtpu") is not None or os.path.isfile(LIBTPU)


@pytest.fixture(scope="session")
def tpu_topology():
    """`devices(name, num_slices=1)`: the compile-only devices of a TPU topology, to compile for
    a TPU ahead of time on this CPU; skips the test where libtpu is not installed."""
    if not HAS_LIBTPU:
        pytest.skip(
            "needs libtpu for compile-only TPU devices: `make test` sets XLSCALE_LIBTPU, or "
            "pip install 'jax[tpu]==0.10.2'"
        )
    from jax.experimental import topologies

    def devices(name: str, num_slices: int = 1):
        with pytest.MonkeyPatch.context() as env:
            if os.path.isfile(LIBTPU):
                env.setenv("TPU_LIBRARY_PATH", LIBTPU)
            # Compile-only: another process (a second pytest, a benchmark) may hold its lock.
            env.setenv("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
            return topologies.get_topology_desc(name, platform="tpu", num_slices=num_slices).devices

    return devices


def shared_cache_dir(tmp_path_factory) -> Path:
    """One compilation cache directory for the whole test session, shared by the xdist workers
    (their base temporary directories are siblings): the modules that use `compilation_cache`
    run the same tiny configurations, so each program compiles once per session."""
    base = tmp_path_factory.getbasetemp()
    root = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    path = root / "xla-shared"
    path.mkdir(exist_ok=True)
    return path


@pytest.fixture(scope="module")
def compilation_cache(tmp_path_factory):
    """A persistent compilation cache while a module runs, for the modules that use it
    (`pytestmark = pytest.mark.usefixtures("compilation_cache")`): runs of one configuration
    (full, stopped, resumed, NaN) compile their steps once instead of four times, and once for
    every module that uses this fixture (`shared_cache_dir`). Modules without it compile as
    before."""
    import jax
    from jax.experimental.compilation_cache import compilation_cache as cc

    jax.config.update("jax_compilation_cache_dir", os.fspath(shared_cache_dir(tmp_path_factory)))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)
    cc.reset_cache()
    yield
    jax.config.update("jax_compilation_cache_dir", None)
    cc.reset_cache()


@pytest.fixture
def tmpfs(tmp_path):
    """`mount(size_mib) -> Path`: a tmpfs of `size_mib` MiB mounted under `tmp_path` (the first at
    `tmp_path / "disk"`), each unmounted after the test; skips the test where it cannot mount one
    (it needs root, which CI has). For the tests of a disk that really fills up: each module
    picks the size its runs need."""
    import subprocess

    mounts = []

    def mount(size_mib: int) -> Path:
        if os.geteuid() != 0:
            pytest.skip("mounting a tmpfs needs root (CI runs as root)")
        path = tmp_path / ("disk" if not mounts else f"disk{len(mounts) + 1}")
        path.mkdir()
        done = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size_mib}m", "tmpfs", os.fspath(path)],
            capture_output=True,
            text=True,
        )
        if done.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
        mounts.append(path)
        return path

    yield mount
    for path in reversed(mounts):
        subprocess.run(["umount", "-l", os.fspath(path)], check=False)


@pytest.fixture
def no_compile(monkeypatch):
    """Makes any attempt to plan (and so compile) a run fail: the checks under test come first."""
    from trainer import train as train_lib

    def refuse(**kwargs):
        raise AssertionError("the run was planned")

    monkeypatch.setattr(train_lib.plan_lib, "build_run_plan", refuse)


@pytest.fixture(scope="module")
def finished(tiny_data, tmp_path_factory, seqio_state):
    """A finished `resume_runs.base_kwargs` run, once per module that uses it."""
    from resume_runs import STEPS, base_kwargs

    from trainer import train as train_lib

    model_dir = tmp_path_factory.mktemp("resume") / "finished"
    with seqio_state.kept():
        result = train_lib.train(model_dir=model_dir, **base_kwargs(tiny_data))
    assert result.completed and result.step == STEPS
    return model_dir


@pytest.fixture
def clean_gin():
    """An empty gin configuration before and after the test."""
    import gin

    gin.clear_config()
    yield
    gin.clear_config()


@pytest.fixture(scope="module")
def other_vocab(tiny_data, tmp_path_factory):
    """A second SentencePiece model of the fixture corpora: other pieces, so other token ids."""
    from pipelines import vocab

    root = tmp_path_factory.mktemp("other_vocab")
    return vocab.train_vocab(
        corpora_dir=tiny_data["corpora"], langs=["en", "fr"], out_prefix=root / "v", vocab_size=300
    )


# XLSCALE_TEST_CPU_LOG=FILE: each test's CPU seconds (its worker's user + system time, plus the
# user + system time of the subprocesses it waited for: trainers, CLIs) appended to FILE as
# tab-separated `seconds  nodeid` lines, to find where the suite's CPU goes (docs/testing.md).
CPU_LOG_ENV = "XLSCALE_TEST_CPU_LOG"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """Measures a test's CPU (setup, call and teardown) when XLSCALE_TEST_CPU_LOG names a file."""
    path = os.environ.get(CPU_LOG_ENV)
    if not path:
        yield
        return
    before = os.times()
    yield
    after = os.times()
    seconds = sum(
        getattr(after, f) - getattr(before, f)
        for f in ("user", "system", "children_user", "children_system")
    )
    with open(path, "a") as log:
        log.write(f"{seconds:.2f}\t{item.nodeid}\n")
