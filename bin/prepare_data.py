#!/usr/bin/env python3
"""`tf-transformer-prepare-data` run from a clone; tf_transformer/cli/prepare_data.py
says what it does."""

from tf_transformer.cli import prepare_data

if __name__ == "__main__":
  prepare_data.run()
