"""TensorBoard summaries of a run: scalars, sample translations as text,
attention heatmaps as images labelled with their tokens (Figures 3-5 of the
paper), and hparams."""

import os

import numpy as np
import tensorflow as tf
from tensorboard.plugins.hparams import api as hparams_api

from tf_transformer import plots


class Summaries:
  """Writers for `model_dir/train` and `model_dir/dev` (chief only)."""

  def __init__(self, model_dir, enabled=True):
    self.enabled = enabled
    if enabled:
      self.train = tf.summary.create_file_writer(os.path.join(model_dir,
                                                              "train"))
      self.dev = tf.summary.create_file_writer(os.path.join(model_dir, "dev"))

  def scalars(self, writer_name, step, values):
    if not self.enabled:
      return
    with getattr(self, writer_name).as_default(step=step):
      for name, value in values.items():
        tf.summary.scalar(name, value)
    getattr(self, writer_name).flush()

  def hparams(self, values):
    if not self.enabled:
      return
    with self.train.as_default():
      hparams_api.hparams({k: v for k, v in values.items()
                           if isinstance(v, (bool, int, float, str))})

  def translations(self, step, samples):
    """samples: [(source, reference, hypothesis)] as a markdown table."""
    if not self.enabled:
      return
    rows = ["| source | reference | translation |", "| --- | --- | --- |"]
    rows += [f"| {s} | {r} | {h} |" for s, r, h in samples]
    with self.dev.as_default(step=step):
      tf.summary.text("sample_translations", "\n".join(rows))
    self.dev.flush()

  def attention(self, step, weights, source_tokens, target_tokens):
    """One image per kind and layer, tagged attention/KIND/layer_L (from
    1), its heads side by side with the tokens on the axes, as the paper's
    Figures 3-5 draw them (`plots.layer_image`). `weights` maps
    "encoder_self"/"decoder_self"/"encoder_decoder" to a list of per-layer
    [batch, heads, query, key] tensors, of which the first sentence is
    drawn; `source_tokens` and `target_tokens` are its subwords (the
    target's as the decoder outputs them, EOS last)."""
    if not self.enabled:
      return
    with self.dev.as_default(step=step):
      for kind, layers in weights.items():
        rows, columns = plots.axes_tokens(kind, source_tokens, target_tokens)
        for index, layer in enumerate(layers):
          png = plots.layer_image(
              np.asarray(layer[0])[:, :len(rows), :len(columns)], rows,
              columns, f"{kind}, layer {index + 1} of {len(layers)}, step "
              f"{step}")
          tf.summary.image(f"attention/{kind}/layer_{index + 1}",
                           tf.io.decode_png(png)[tf.newaxis])
    self.dev.flush()
