"""The user documentation holds together and says what is true now: README.md
stays a short entry point, docs/ stay a reference (no dated headings, no
dated story), and every relative link reaches a file (and, for `#anchors`,
a heading of that file)."""

import ast
import glob
import os
import re
import subprocess
import sys

import pytest

from conftest import REPO

PAGES = ["README.md"] + sorted(
    os.path.join("docs", name) for name in os.listdir(os.path.join(REPO,
                                                                     "docs"))
    if name.endswith(".md"))


def _anchor(heading):
  """GitHub's anchor for a heading: lowercase, punctuation dropped, spaces
  to hyphens."""
  return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


# A date, a commit hash (7+ hex digits with a digit and a letter), or a
# host's CPU by its product name: what a figure's configuration line names.
DATED = re.compile(r"\b20\d\d-\d\d-\d\d\b|\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*\d)"
                   r"[0-9a-f]{7,40}\b|EPYC|Xeon")


def _prose(text):
  """`text` without its fenced code blocks."""
  return re.sub(r"^```.*?^```", "", text, flags=re.M | re.S)


def _read(page):
  with open(os.path.join(REPO, page), encoding="utf-8") as f:
    return f.read()


def test_readme_is_an_entry_point_not_a_manual():
  """At most 1,200 words outside its code blocks, prose lines under 100
  characters, and dates, commit hashes and host names only in the results
  table's one configuration line (an italic paragraph)."""
  prose = _prose(_read("README.md"))
  assert len(prose.split()) <= 1200
  for line in prose.splitlines():
    assert line.startswith("|") or len(line) < 100, line
  configurations = [p for p in prose.split("\n\n") if DATED.search(p)]
  assert len(configurations) == 1, configurations
  assert configurations[0].startswith("*") and configurations[0].endswith(
      "*"), configurations


def test_docs_are_a_reference_of_at_most_20000_words():
  """docs/ say how things are now: at most 20,000 words in all, no date in
  a heading, and a date, commit hash or host name only in a figure's
  configuration line (an italic paragraph) or a line of a table."""
  words = 0
  for page in PAGES[1:]:
    text = _read(page)
    words += len(text.split())
    for heading in re.findall(r"^#+ .*$", text, re.M):
      assert not DATED.search(heading), (page, heading)
    for paragraph in _prose(text).split("\n\n"):
      paragraph = paragraph.strip()
      if DATED.search(paragraph) and not paragraph.startswith(("*", "|")):
        raise AssertionError(f"{page}: {paragraph[:300]}")
  assert words <= 20000, words


@pytest.mark.parametrize("page", PAGES + ["CONTRIBUTING.md"])
def test_relative_links_resolve(page):
  text = _prose(_read(page))
  links = re.findall(r"\]\(([^)\s]+)\)", text)
  relative = [l for l in links if not re.match(r"[a-z]+://", l)]
  for link in relative:
    path, _, anchor = link.partition("#")
    target = os.path.normpath(os.path.join(os.path.dirname(page), path)) \
        if path else page
    assert os.path.isfile(os.path.join(REPO, target)), (page, link)
    if anchor:
      with open(os.path.join(REPO, target), encoding="utf-8") as f:
        headings = [_anchor(h) for h in re.findall(r"^#+ (.*)$", f.read(),
                                                   re.M)]
      assert anchor in headings, (page, link, headings)
  if page == "README.md":
    assert len(relative) >= 8  # the README points into every docs page


def _block_after(text, marker):
  """The fenced code block after `<!-- marker -->` in `text`."""
  return re.search(rf"^<!-- {marker} -->\n```\n(.*?)^```", text,
                   re.M | re.S).group(1)


def test_the_quick_tier_is_the_suite_less_its_slow_tests():
  """README.md gives the quick tier after <!-- quick-test-command -->, the
  suite without the tests marked `slow` (conftest.py registers the mark);
  the full command, which .ci/run runs, deselects nothing, then runs the
  quick tier's numeric tests under an AVX2-capped oneDNN and under Eigen's
  kernels (the `numeric` and `bfloat16` marks say why)."""
  readme = _read("README.md")
  quick, full = (_block_after(readme, marker) for marker in (
      "quick-test-command", "test-command"))
  assert re.fullmatch(r'python -m pytest .*-m "not slow" tests\n', quick)
  first, *capped = full.splitlines()
  options = first.split(" pytest ", 1)[1]
  assert " -m " not in options and " -k " not in options
  assert capped == [
      'ONEDNN_MAX_CPU_ISA=AVX2 python -m pytest -q -n auto '
      '-m "numeric and not slow and not bfloat16" tests',
      'TF_ENABLE_ONEDNN_OPTS=0 python -m pytest -q -n auto '
      '-m "numeric and not slow" tests']
  with open(os.path.join(REPO, ".ci", "run"), encoding="utf-8") as f:
    assert "<!-- test-command -->" in f.read()


def test_the_job_quotes_the_readmes_multi30k_row():
  """The Multi30k job compares its budget with README.md's run
  (`tasks.Shown`, `budget.against_shown`): that run is the row of README's
  table by CPU whose host, steps and epochs the task names."""
  from tf_transformer.run import tasks
  shown = tasks.TASKS["multi30k"].shown
  rows = [line for line in _read("README.md").splitlines()
          if line.startswith(f"| {shown.host} |")]
  assert len(rows) == 1, (shown.host, rows)
  cells = [c.strip() for c in rows[0].strip("|").split("|")]
  assert f"{shown.steps:,}" in cells and f"{shown.epochs:.1f}" in cells, (
      cells, shown)
  assert shown.minutes == tasks.TASKS["multi30k"].train_minutes


def _commands(text):
  """The `python bin/NAME.py ...` lines of `text`'s code blocks,
  continuation lines joined."""
  for block in re.findall(r"^```\n(.*?)^```", text, re.M | re.S):
    for line in block.replace("\\\n", " ").splitlines():
      for match in re.finditer(r"python (bin/\w+\.py)((?: +--?[\w-]+(?:=\S*)?)*)",
                               line):
        yield match.group(1), [
            re.match(r"--?([\w-]+)", token).group(1)
            for token in match.group(2).split()]


@pytest.mark.parametrize("page", PAGES)
def test_every_command_shown_exists_with_the_flags_it_shows(page):
  """Each `python bin/NAME.py --flag ...` of a page's code blocks names a
  command that exists and flags it defines (its --help lists them; absl's
  --noflag form too)."""
  helps = {}
  for script, names in _commands(_read(page)):
    assert os.path.isfile(os.path.join(REPO, script)), (page, script)
    if script not in helps:
      result = subprocess.run([sys.executable, script, "--helpfull"],
                              capture_output=True, text=True, cwd=REPO,
                              timeout=120)
      assert result.returncode == 0, result.stderr[-2000:]
      helps[script] = set(re.findall(r"^\s+--(?:\[no\])?([\w-]+):",
                                     result.stdout, re.M))
    for name in names:
      defined = name in helps[script] or (
          name.startswith("no") and name[2:] in helps[script])
      assert defined or name in ("v", "helpfull"), (page, script, name)


def _flag_names():
  """{name pattern: files} of every flag the package and bin/ define (an
  f-string name, such as `f"{split}_source"`, as a pattern with `\\w+`)."""
  names = {}
  for path in glob.glob(os.path.join(REPO, "tf_transformer", "**", "*.py"),
                        recursive=True) + glob.glob(os.path.join(REPO, "bin",
                                                                 "*.py")):
    for node in ast.walk(ast.parse(_read(os.path.relpath(path, REPO)))):
      if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
          and node.func.attr.startswith("DEFINE_")):
        name = node.args[0]
        if isinstance(name, ast.JoinedStr):
          pattern = "".join(re.escape(part.value) if isinstance(
              part, ast.Constant) else r"\w+" for part in name.values)
        else:
          pattern = re.escape(name.value)
        names.setdefault(pattern, set()).add(os.path.relpath(path, REPO))
  return names


def _hparam_names():
  """The config's fields, each a `--hparams=name=value` (tf_transformer/
  config.py)."""
  import dataclasses  # pylint: disable=g-import-not-at-top
  from tf_transformer import get_config  # pylint: disable=g-import-not-at-top
  config = get_config("tiny")
  return [field.name for part in dataclasses.fields(config)
          for field in dataclasses.fields(getattr(config, part.name))]


def test_every_flag_and_hparam_is_documented():
  """Each flag of the installed commands and each hparam is named in
  README.md or docs/ (as `--name`, `--noname`, `name=` or `name` in
  backquotes), where its case is told."""
  text = "".join(_read(page) for page in PAGES)
  names = _flag_names()
  assert len(names) > 100, len(names)  # the parse found the flags
  hparams = _hparam_names()
  assert "adam_epsilon" in hparams and len(hparams) > 20, hparams
  names.update({name: {"tf_transformer/config.py"} for name in hparams
                if not re.search(rf"\b{name}=", text)})
  missing = {pattern: files for pattern, files in names.items()
             if not re.search(rf"--(?:no)?{pattern}\b|`{pattern}`", text)}
  assert not missing, missing
