"""How every bin/ command runs: absl's `app.run`, with two fixes for users.

- `--help` lists every flag the command reads. absl shows only the main
  module's flags there (the data and decoding flags, defined in shared
  modules, hid behind `--helpfull` among absl's and TensorFlow's own); here
  the flags of every `tf_transformer` module become the command's key flags.
- `--help` (and `--helpfull`, `--helpshort`, `-?`) exit with status 0, as
  asking for help is not an error; absl exits 1.
"""

import sys

from absl import app
from absl import flags

HELP_FLAGS = ("help", "helpshort", "helpfull", "helpxml", "?")


def run(main):
  """`app.run(main)` with the package's flags in --help, which exits 0."""
  for module, defined in flags.FLAGS.flags_by_module_dict().items():
    if module.startswith("tf_transformer."):
      for flag in defined:  # key flags of the main module: what --help shows
        flags.FLAGS.register_key_flag_for_module(sys.argv[0], flag)
  started = []

  def main_started(argv):
    started.append(True)
    return main(argv)

  try:
    app.run(main_started)
  except SystemExit as e:
    if not started and e.code == 1 and _asked_for_help(sys.argv[1:]):
      sys.exit(0)
    raise


def _asked_for_help(args):
  return any(arg.lstrip("-").split("=")[0] in HELP_FLAGS for arg in args
             if arg.startswith("-"))
