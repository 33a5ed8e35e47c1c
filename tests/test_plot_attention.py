"""bin/plot_attention.py writes one PNG heatmap per kind, layer and head,
from an export's attention signature or from a checkpoint."""

import numpy as np
import pytest
import tensorflow as tf

from tf_transformer import plots
from conftest import run_script

SENTENCE = "four hundred and twenty-one"


@pytest.fixture(scope="module")
def models(untrained_export):
  return untrained_export


def _image(path):
  image = tf.io.decode_png(tf.io.read_file(str(path)))
  assert image.shape[0] > 100 and image.shape[1] > 100
  return image


@pytest.mark.slow
def test_pngs_for_chosen_layers_and_heads(models, tmp_path):
  _, exported = models
  result = run_script("plot_attention.py", f"--model={exported}",
                      f"--sentence={SENTENCE}", "--layers=1,2", "--heads=1,4",
                      "--kind=encoder_decoder,encoder_self",
                      f"--output_dir={tmp_path}")
  assert result.returncode == 0, result.stderr[-2000:]
  names = sorted(p.name for p in tmp_path.iterdir())
  assert names == sorted(f"{kind}_layer{layer}_head{head}.png"
                         for kind in ("encoder_decoder", "encoder_self")
                         for layer in (1, 2) for head in (1, 4))
  assert result.stdout.startswith("translation: ")
  for name in names:
    _image(tmp_path / name)


@pytest.mark.slow
def test_checkpoint_plots_the_last_layer_by_default(models, tmp_path):
  model_dir, _ = models
  result = run_script("plot_attention.py", f"--model_dir={model_dir}",
                      f"--sentence={SENTENCE}", "--kind=decoder_self",
                      f"--output_dir={tmp_path}")
  assert result.returncode == 0, result.stderr[-2000:]
  assert sorted(p.name for p in tmp_path.iterdir()) == [
      f"decoder_self_layer2_head{h}.png" for h in (1, 2, 3, 4)]


def test_bad_layer_and_kind_are_named(models, tmp_path):
  _, exported = models
  layer = run_script("plot_attention.py", f"--model={exported}",
                     f"--sentence={SENTENCE}", "--layers=3",
                     f"--output_dir={tmp_path}")
  assert layer.returncode != 0
  assert "--layers=3: the decoder has 2 layers" in layer.stderr
  kind = run_script("plot_attention.py", f"--model={exported}",
                    f"--sentence={SENTENCE}", "--kind=cross",
                    f"--output_dir={tmp_path}")
  assert kind.returncode != 0 and "--kind" in kind.stderr


def test_heatmap_shape_is_checked(tmp_path):
  path = plots.attention_heatmap([[0.25, 0.75]], ["a"], ["b", "c"], "t",
                                 str(tmp_path / "h.png"))
  image = _image(path)
  assert image.shape[-1] in (3, 4)
  with pytest.raises(ValueError, match="do not match"):
    plots.attention_heatmap([[1.0]], ["a"], ["b", "c"], "t",
                            str(tmp_path / "x.png"))


def test_a_layer_image_shows_every_head_with_its_tokens():
  """TensorBoard's attention image of one layer (plots.layer_image): a
  panel a head, `HEADS_PER_ROW` a row, grown with the tokens; mismatched
  tokens are refused."""
  rows, columns = ["▁Zwei", "▁Hunde", "</s>"], ["▁Two", "▁dogs", ".", "</s>"]
  per_row = plots.HEADS_PER_ROW
  weights = lambda heads, keys=4: np.full([heads, 3, keys], 1.0 / keys)
  decode = lambda png: tf.io.decode_png(png).numpy()
  one_row = decode(plots.layer_image(weights(per_row), rows, columns, "t"))
  two_rows = decode(plots.layer_image(weights(2 * per_row), rows, columns,
                                      "t"))
  longer = decode(plots.layer_image(weights(per_row, 8), rows, columns * 2,
                                    "t"))
  assert one_row.shape[1] > 100 and one_row.shape[0] > 100
  assert two_rows.shape[1] == one_row.shape[1]
  assert two_rows.shape[0] > 1.5 * one_row.shape[0] - 60  # title once
  assert longer.shape[1] > one_row.shape[1]
  with pytest.raises(ValueError, match="do not match"):
    plots.layer_image(weights(per_row), rows[:2], columns, "t")


def test_a_layer_images_margins_fit_its_longest_tokens():
  """The margins are measured from the labels: long tokens are drawn
  whole, inside the image (its edges stay white), and short ones leave
  narrow margins."""
  decode = lambda png: tf.io.decode_png(png).numpy()[..., :3]
  weights = np.full([2, 3, 3], 1.0 / 3)
  short, long = ["a", "b", "c"], ["▁a", "WWWWWWWWWWWWWWWW", "▁photographers"]
  for rows, columns in ((long, short), (short, long), (long, long)):
    image = decode(plots.layer_image(weights, rows, columns, "t"))
    for edge in (image[:, 0], image[:, -1], image[0], image[-1]):
      assert (edge == 255).all()  # nothing drawn up to an edge
    ink = (image < 128).any(axis=2)
    assert ink[:, :3].sum() == 0 and ink[-3:].sum() == 0
  narrow = decode(plots.layer_image(weights, short, short, "t"))
  wide = decode(plots.layer_image(weights, long, short, "t"))
  tall = decode(plots.layer_image(weights, short, long, "t"))
  # 16 W at 8 points are more than an inch (100 pixels) wider than "a".
  assert wide.shape[1] > narrow.shape[1] + 100
  assert tall.shape[0] > narrow.shape[0] + 100
