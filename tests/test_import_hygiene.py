"""Importing the model and fitting packages must not pull in TensorFlow (it is heavy, and these
packages run in processes that never touch data pipelines, e.g. inside real T5X or a notebook)."""

import pytest
from conftest import imported_with

LIGHT_MODULES = [
    "modeling.axes",
    "modeling.decoding",
    "modeling.family",
    "modeling.models",
    "fitting.reports.fit_all",
    "studies.registry",
    "llama_jax.model",
    "llama_jax.sizes",
    "llama_jax.counting",
    "t5_jax.model",
    "t5_jax.sizes",
    "fitting.laws.robust_fit",
    "fitting.laws.formulas",
    "fitting.readers.run_dirs",
    "fitting.design.simulate",
    "fitting.design.simulate_mt",
    "fitting.reports.design_report",
    "launch.sweep",
    # training hosts read prepared tasks without TensorFlow
    "pipelines.prepared.manifest",
    "pipelines.prepared.shards",
    "pipelines.features",
    "pipelines.prepared.batches",
    "pipelines.prepared.eval_batches",
    # a run on prepared data reads its vocabulary and mixture without seqio
    "pipelines.vocab",
    "pipelines.mixture_tables",
    "pipelines.mixtures",
    # the trainer's data wiring and gin recipes import seqio only when a run reads seqio data
    "trainer.data",
    "trainer.recipes",
    "trainer.train",
    "trainer.eval",
]


@pytest.mark.slow
@pytest.mark.parametrize("module", LIGHT_MODULES)
def test_module_does_not_import_tensorflow(module):
    heavy = imported_with(module, ("tensorflow", "seqio", "tensorflow_datasets"))
    assert heavy == [], f"{module} imports {','.join(heavy)}"
