"""`run.json` as a typed record: `RunRecord`, and the training strategies (`Strategy`).

The trainer writes one `run.json` per run (`trainer.train`), the converters one per converted
checkpoint (`convert.hf_checkpoints`, `convert.grown_init`, which set `kind`), and the synthetic
studies write the trainer's format from the papers' laws; `fitting`, `studies`, `launch`, `evals`
and the CLI read it. Every field is declared here once, in the order the trainer writes it, with
the default a reader assumes where an older record lacks it (the field defaults below are that
one place).

`RunRecord.from_json(info).to_json() == info` for every record, key order included: a record read
from a file remembers its keys (`key_order`), so fields the file lacked are not added on the way
back, and keys this module does not know are kept in `extra`. A record built directly (the
trainer's) writes every field in the declared order, leaving out only the `OPTIONAL` fields it
did not set.
"""

from __future__ import annotations

import dataclasses
import enum
import math
from collections.abc import Mapping
from typing import Any


class Strategy(enum.StrEnum):
    """How a run was trained (`run.json` `strategy`; the trainer's `RunInfo.strategy`).

    The CPT paper's: `source` (pretraining on the source language), `scratch` (the target
    language from random initialisation), `cpt` (continued pretraining from a source checkpoint),
    `cpt_replay` (CPT with source data replayed). The MT paper's: `pretrain` (span corruption),
    `finetune` (translation from a pretrained checkpoint), `finetune_scratch` (the same without
    pretraining: the baseline).
    """

    SOURCE = "source"
    SCRATCH = "scratch"
    CPT = "cpt"
    CPT_REPLAY = "cpt_replay"
    PRETRAIN = "pretrain"
    FINETUNE = "finetune"
    FINETUNE_SCRATCH = "finetune_scratch"


# Strategies trained from random initialisation on one language (the CPT paper's scratch laws).
FROM_SCRATCH: tuple[Strategy, ...] = (Strategy.SOURCE, Strategy.SCRATCH)
# The CPT paper's upstream strategies, and the MT paper's finetunes (with their baseline).
UPSTREAM: tuple[Strategy, ...] = (*FROM_SCRATCH, Strategy.CPT, Strategy.CPT_REPLAY)
CPT_STRATEGIES: tuple[Strategy, ...] = (Strategy.CPT, Strategy.CPT_REPLAY)
FINETUNES: tuple[Strategy, ...] = (Strategy.FINETUNE, Strategy.FINETUNE_SCRATCH)


def strategy_of(value: Any) -> Strategy | str:
    """`value` as a `Strategy` where it names one, else as the string it is (a record of another
    tool, or an empty one)."""
    if isinstance(value, Strategy):
        return value
    text = "" if value is None else str(value)
    try:
        return Strategy(text)
    except ValueError:
        return text


# Fields a record built directly leaves out of its JSON while they hold their default: the
# trainer adds the fingerprint and (on an amended resume) the amendments; the converters' fields;
# `params_nominal`, which a record may carry for the nominal-N basis (`fitting.model_keys`); the
# trainer's `param_basis` and `vocab_sha256`, which records from before them lack.
OPTIONAL = frozenset(
    {
        "param_basis",
        "vocab_sha256",
        "fingerprint",
        "amendments",
        "params_nominal",
        "kind",
        "vocab_size",
        "llama_config",
        "tokenizer_file",
    }
)
# Fields held as tuples in the record and written as JSON lists.
_LISTS = frozenset({"languages", "components", "amendments"})
# Not fields of run.json.
_META = frozenset({"extra", "key_order"})


@dataclasses.dataclass(frozen=True)
class RunRecord:
    """The contents of one `run.json` (docs/interfaces.md, "Training outputs").

    Defaults are what a reader assumes when an older record lacks the field. Counts are as the
    trainer computed them (non-embedding N is `params_non_embedding`).

    Attributes:
      model, family: the size name and model family (`llama2`, `t5`).
      params_total, params_non_embedding: parameter counts with and without embeddings.
      strategy: a `Strategy` (or, for a record of another tool, the string it holds).
      languages, target_lang, source_lang: the run's languages (ISO 639-1).
      replay_ratio: the source-language share of a CPT-with-replay mixture.
      mixture_or_task: the seqio mixture or task trained on; components: its tasks.
      init_checkpoint, init_step, init_params_hash: the checkpoint the parameters came from.
      init_vocab_extension: a grown `INIT_CHECKPOINT`'s extension record (`convert.grown_init`).
      init_import: an imported `INIT_CHECKPOINT`'s provenance (`convert.hf_checkpoints`).
      seed, seq_len, task_feature_lengths: the data settings.
      finetune_tokens, finetune_recipe: a finetune's Df as given and its recipe name.
      token_units, tokens_paper_per_step, finetune_unit, finetune_pairs, finetune_tokens_paper:
        the paper-unit fields (`rundir.paper_units.run_fields`).
      batch_size, train_steps, flops_per_token, flops_per_token_attn: counts of the run.
      gin_config: the resolved gin config.
      param_basis: the N its token budget multiplied (`modeling.family.PARAM_BASES`; None: a
        record from before the setting, whose steps came from the non-embedding count).
      vocab_sha256: SHA-256 of the vocabulary file it trained on (None: unknown, e.g. an older
        record); a run initialised from this one must use the same (`trainer.plan`).
      fingerprint: the settings that define the run (`trainer.fingerprint`); None before it.
      amendments: the amended resumes, in order (`trainer.fingerprint.record_resume`).
      params_nominal: the paper's nominal N where a record carries it.
      kind, vocab_size, llama_config, tokenizer_file: a converted checkpoint's record
        (`convert.hf_checkpoints.IMPORT_KIND`, `convert.grown_init.GROWN_KIND`).
      extra: keys this module does not know, kept for the round trip (e.g. T5X's `runner`).
      key_order: the keys of the JSON object the record was read from (empty for a record built
        directly); `to_json` writes them in that order.
    """

    model: str | None = None
    family: str | None = None
    params_total: float | None = None
    params_non_embedding: float | None = None
    strategy: Strategy | str = ""
    languages: tuple[str, ...] = ()
    target_lang: str | None = None
    source_lang: str | None = None
    replay_ratio: float = 0.0
    mixture_or_task: str = ""
    components: tuple[str, ...] = ()
    init_checkpoint: str | None = None
    init_step: int | None = None
    init_params_hash: str | None = None
    init_vocab_extension: Mapping[str, Any] | None = None
    init_import: Mapping[str, Any] | None = None
    seed: int | None = None
    seq_len: int | None = None
    task_feature_lengths: Mapping[str, int] = dataclasses.field(default_factory=dict)
    finetune_tokens: int | None = None
    finetune_recipe: str | None = None
    token_units: Mapping[str, str] | None = None
    tokens_paper_per_step: float | None = None
    finetune_unit: str = "target"
    finetune_pairs: int | None = None
    finetune_tokens_paper: int | None = None
    batch_size: int | None = None
    train_steps: int | None = None
    flops_per_token: float | None = None
    flops_per_token_attn: float | None = None
    gin_config: str = ""
    param_basis: str | None = None
    vocab_sha256: str | None = None
    fingerprint: Mapping[str, Any] | None = None
    amendments: tuple[Mapping[str, Any], ...] = ()
    params_nominal: float | None = None
    kind: str | None = None
    vocab_size: int | None = None
    llama_config: Mapping[str, Any] | None = None
    tokenizer_file: str | None = None
    extra: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    key_order: tuple[str, ...] = dataclasses.field(default=(), compare=False, repr=False)

    def __post_init__(self):
        object.__setattr__(self, "strategy", strategy_of(self.strategy))
        for name in _LISTS:
            value = getattr(self, name)
            if not isinstance(value, tuple):
                object.__setattr__(self, name, tuple(value or ()))

    @classmethod
    def from_json(cls, info: Mapping[str, Any]) -> RunRecord:
        """The record of a `run.json` object; missing fields take their defaults, unknown keys go
        to `extra`."""
        known = {k: v for k, v in info.items() if k in FIELDS}
        extra = {k: v for k, v in info.items() if k not in FIELDS}
        return cls(**known, extra=extra, key_order=tuple(info))

    @classmethod
    def of(cls, value: RunRecord | Mapping[str, Any]) -> RunRecord:
        """`value` itself when it is a record, else `from_json(value)` (readers that also take a
        run.json dict)."""
        return value if isinstance(value, RunRecord) else cls.from_json(value)

    def to_json(self) -> dict[str, Any]:
        """The `run.json` object: for a record read from a file exactly that file's object (fields
        changed since come after its keys); for one built directly, every field in the declared
        order (the `OPTIONAL` ones only when set), then `extra`."""
        if self.key_order:
            keys = [*self.key_order]
            keys += [k for k in FIELDS if k not in self.key_order and not self._is_default(k)]
        else:
            keys = [k for k in FIELDS if k not in OPTIONAL or not self._is_default(k)]
        keys += [k for k in self.extra if k not in keys]
        out = {}
        for key in keys:
            if key in FIELDS:
                out[key] = self._json_value(key)
            elif key in self.extra:
                out[key] = self.extra[key]
        return out

    def holds(self, name: str) -> bool:
        """Whether the record holds field `name`: the file it was read from had it, or (for a
        record built directly) `to_json` writes it. For readers that treat a field a record lacks
        differently from one it holds as None."""
        if self.key_order:
            return name in self.key_order or (name in FIELDS and not self._is_default(name))
        return name in FIELDS and (name not in OPTIONAL or not self._is_default(name))

    def _json_value(self, name: str) -> Any:
        value = getattr(self, name)
        if name in _LISTS:
            return list(value)
        if isinstance(value, Strategy):
            return value.value
        return value

    def _is_default(self, name: str) -> bool:
        return self._json_value(name) == _DEFAULT_JSON[name]

    # --- what readers derive ------------------------------------------------------------------

    @property
    def language(self) -> str:
        """The language the run is trained for: its target language, else its source language,
        else its first language ('' when it names none)."""
        lang = self.target_lang or self.source_lang
        if not lang and self.languages:
            lang = self.languages[0]
        return str(lang or "")

    @property
    def all_languages(self) -> tuple[str, ...]:
        """The run's languages, target first, each once."""
        langs = [self.target_lang, *self.languages, self.source_lang]
        return tuple(dict.fromkeys(lang for lang in langs if lang))

    @property
    def n_non_embedding(self) -> float:
        """`params_non_embedding` as a float (NaN when the record has none)."""
        value = self.params_non_embedding
        return math.nan if value in (None, "") else float(value)


FIELDS: tuple[str, ...] = tuple(
    f.name for f in dataclasses.fields(RunRecord) if f.name not in _META
)
# Each field's default as JSON (what `to_json` compares against to leave a field out).
_DEFAULT_JSON: Mapping[str, Any] = {name: RunRecord()._json_value(name) for name in FIELDS}
