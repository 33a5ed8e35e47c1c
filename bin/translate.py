#!/usr/bin/env python3
"""`tf-transformer-translate` run from a clone; tf_transformer/cli/translate.py
says what it does."""

from tf_transformer.cli import translate

if __name__ == "__main__":
  translate.run()
