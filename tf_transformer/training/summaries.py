"""TensorBoard summaries of a run: scalars, sample translations as text,
attention heatmaps as images (Figures 3-5 of the paper), and hparams."""

import os

import tensorflow as tf
from tensorboard.plugins.hparams import api as hparams_api


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

  def attention(self, step, weights, scale=8):
    """One grayscale heatmap per kind (last layer, all heads side by side):
    weights maps "encoder_self"/"decoder_self"/"encoder_decoder" to a list
    of per-layer [batch, heads, query, key] tensors."""
    if not self.enabled:
      return
    with self.dev.as_default(step=step):
      for kind, layers in weights.items():
        tf.summary.image(f"attention/{kind}", heatmap(layers[-1][0], scale))
    self.dev.flush()


def heatmap(heads, scale=8):
  """[heads, query, key] weights in [0, 1] -> one [1, H, W, 1] image with the
  heads side by side, each cell `scale` pixels, rows = queries."""
  heads = tf.cast(heads, tf.float32)
  heads = heads / tf.maximum(tf.reduce_max(heads, axis=[1, 2], keepdims=True),
                             1e-9)
  gap = tf.ones_like(heads[:, :, :1])
  tiles = tf.concat([tf.concat([h, g], axis=1) for h, g in
                     zip(tf.unstack(heads), tf.unstack(gap))], axis=1)
  image = tf.repeat(tf.repeat(tiles, scale, axis=0), scale, axis=1)
  return image[tf.newaxis, :, :, tf.newaxis]
