#!/usr/bin/env python3
"""`tf-transformer-export` run from a clone; tf_transformer/cli/export.py
says what it does."""

from tf_transformer.cli import export

if __name__ == "__main__":
  export.run()
