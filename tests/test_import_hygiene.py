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
    # zero-shot scoring encodes with SentencePiece alone (`pipelines.vocab.PlainVocabulary`)
    "evals.scorer",
]


@pytest.mark.slow
@pytest.mark.parametrize("module", LIGHT_MODULES)
def test_module_does_not_import_tensorflow(module):
    heavy = imported_with(module, ("tensorflow", "seqio", "tensorflow_datasets"))
    assert heavy == [], f"{module} imports {','.join(heavy)}"


@pytest.mark.slow
def test_the_gin_recipes_name_tasks_and_mixtures_without_seqio():
    # What a run's gin files call to name its tasks: called on prepared data too.
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from trainer import recipes\n"
        "names = [recipes.lm_task(lang='fr'), *recipes.lm_tasks(langs=['en', 'fr', 'en']),\n"
        "         recipes.replay_mixture(target_lang='fr', source_lang='en', replay_ratio=0.1)]\n"
        "print(','.join(names))\n"
        "print(','.join(m for m in ('tensorflow', 'seqio') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    names, heavy = out.stdout.splitlines()
    assert names == "lm_fr,lm_en,lm_fr,cpt_fr_replay_en_10"
    assert heavy == ""
