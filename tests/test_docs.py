"""The user documentation holds together: README.md stays a short entry
point, and every relative link in it and in docs/ reaches a file (and, for
`#anchors`, a heading of that file)."""

import os
import re

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


def test_readme_is_an_entry_point_not_a_manual():
  with open(os.path.join(REPO, "README.md"), encoding="utf-8") as f:
    assert len(f.read().splitlines()) <= 250


@pytest.mark.parametrize("page", PAGES)
def test_relative_links_resolve(page):
  with open(os.path.join(REPO, page), encoding="utf-8") as f:
    text = re.sub(r"^```.*?^```", "", f.read(), flags=re.M | re.S)
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
