#!/usr/bin/env python3
"""`tf-transformer-import-model` run from a clone; tf_transformer/cli/import_model.py
says what it does."""

from tf_transformer.cli import import_model

if __name__ == "__main__":
  import_model.run()
