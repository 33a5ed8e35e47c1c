#!/usr/bin/env python3
"""`tf-transformer-build-shortlist` run from a clone; tf_transformer/cli/build_shortlist.py
says what it does."""

from tf_transformer.cli import build_shortlist

if __name__ == "__main__":
  build_shortlist.run()
