"""Entry point of the Bazel `py_test` targets: runs one pytest file.

  bazel_pytest.py tests/test_model.py
"""

import sys

import pytest

if __name__ == "__main__":
  sys.exit(pytest.main(["-q", "-p", "no:cacheprovider", *sys.argv[1:]]))
