"""seqio's SentencePiece vocabulary with its TensorFlow tokenizer built once, quietly.

seqio builds a new `tf_text.SentencepieceTokenizer` at every `encode_tf`/`decode_tf`, i.e. for each
tokenizing op of every pipeline; each one loads the model in tf_text's statically linked
SentencePiece, which prints `normalizer.cc(51) LOG(INFO) precompiled_charsmap is empty` on fd 2
for an identity-normalised model like ours (tf_text exposes no log level). Here the tokenizer is
built once per vocabulary, eagerly (`tf.init_scope`, even when first asked for while a pipeline
function is being traced; the pipelines capture its resource) and with fd 2 pointed at the sink
(`pipelines.native_logs`). The tokens are the same: it is the same op on the same model.

Imports seqio and TensorFlow: `pipelines.vocab.load_vocab` imports it when called.
"""

from __future__ import annotations

import seqio
import tensorflow as tf

from pipelines import native_logs


class SentencePieceVocabulary(seqio.SentencePieceVocabulary):
    """`seqio.SentencePieceVocabulary` whose `tf_tokenizer` is built once, eagerly, with its
    native log line kept off the terminal. Equal to seqio's vocabulary of the same file and
    extra ids; pickles (gin deep-copies vocabularies) without the tokenizer, which is rebuilt
    on first use."""

    _tf_tokenizer = None  # the class default: a copy or an unpickled vocabulary starts without

    @property
    def tf_tokenizer(self):
        """The TensorFlow tokenizer of this vocabulary, built on first use."""
        if self._tf_tokenizer is None:
            with tf.init_scope(), native_logs.stderr_to():
                self._tf_tokenizer = super().tf_tokenizer
        return self._tf_tokenizer

    def __getstate__(self):
        state = super().__getstate__()
        state.pop("_tf_tokenizer", None)  # a TensorFlow resource: neither picklable nor compared
        return state
