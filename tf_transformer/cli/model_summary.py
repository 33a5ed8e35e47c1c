"""Prints a model's layer table, then `params=<int>` and `flops_per_token=<int>`:
a preset's, or a trained run's.

  bin/model_summary.py --config=base --vocab_size=37000
  bin/model_summary.py --model_dir=runs/numbers
"""

from absl import app
from absl import flags

from tf_transformer import command
from tf_transformer import config as config_lib
from tf_transformer import cost

FLAGS = flags.FLAGS
flags.DEFINE_enum("config", "base", sorted(config_lib.PRESETS),
                  "Model preset (the paper's base, big, Table 3 rows, ...).")
flags.DEFINE_string("hparams", "", "Overrides, e.g. 'd_model=256,num_layers=2'.")
flags.DEFINE_integer("vocab_size", None, "Shared vocabulary size (default: the "
                     "preset's, 37000 for the paper's English-German).")
flags.DEFINE_string("model_dir", None, "A trained run (or averaged) "
                    "directory: summarize its config.json instead of a "
                    "preset.")
flags.DEFINE_integer("sequence_length", 32, "Tokens per sentence, source and "
                     "target, for the FLOPs per token.")


def main(argv):
  del argv
  # pylint: disable=g-import-not-at-top  (TensorFlow after the flags)
  from tf_transformer import model as model_lib
  from tf_transformer.run import run_dir
  try:
    if FLAGS.model_dir:
      config = run_dir.load_config(FLAGS.model_dir)
      print(f"the model of {FLAGS.model_dir}")
    else:
      config = config_lib.get_config(FLAGS.config, FLAGS.hparams)
    if FLAGS.vocab_size:
      config = config.replace(vocab_size=FLAGS.vocab_size)
  except (ValueError, FileNotFoundError) as e:
    raise app.UsageError(str(e))
  model = model_lib.build_model(config)
  model.summary()
  for stack, layers in ((model.encoder, model.encoder.encoder_layers),
                        (model.decoder, model.decoder.decoder_layers)):
    print(f"{stack.name}: {len(layers)} x {type(layers[0]).__name__}, "
          f"{layers[0].count_params():,} params each")
  print(f"params={model.count_params()}")
  flops = cost.flops_per_token(config.model, FLAGS.sequence_length)
  print(f"flops_per_token={flops}")


def run():
  """`tf-transformer-model-summary`: parses the flags, then runs `main`."""
  command.run(main)
