"""Test setup: 8 host CPU devices for sharding tests, set before anything imports JAX."""

import os

os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
).strip()
os.environ["JAX_PLATFORMS"] = "cpu"
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import pytest  # noqa: E402

pytest_plugins = ["gcs_fixtures"]


@pytest.fixture
def seqio_registry():
    """Empties seqio's task and mixture registries around a test, so tests never see each other's
    registrations (and never depend on import-time side effects)."""
    import seqio

    saved_tasks = dict(seqio.TaskRegistry._REGISTRY)
    saved_mixtures = dict(seqio.MixtureRegistry._REGISTRY)
    seqio.TaskRegistry.reset()
    seqio.MixtureRegistry.reset()
    yield
    seqio.TaskRegistry.reset()
    seqio.MixtureRegistry.reset()
    seqio.TaskRegistry._REGISTRY.update(saved_tasks)
    seqio.MixtureRegistry._REGISTRY.update(saved_mixtures)


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


@pytest.fixture(scope="session")
def seqio_state():
    """`SeqioState`: `saved = seqio_state.snapshot()` ... `seqio_state.restore(saved)`."""
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
