"""BLEU against one sentence's CPU time from serving reports
(`benchmark.py --sections=serving`): each decoder and search of each model
a point (benchmarks/plot_serving.py)."""

import dataclasses
import json

from tf_transformer import plots


@dataclasses.dataclass(frozen=True)
class Point:
  model: str  # the report's label
  decoder: str  # "savedmodel_bfloat16_shortlist 50,300", "ct2_int8 greedy"
  cpu_ms: float  # one sentence a request, CPU milliseconds
  bleu: float  # test BLEU of the same decoder and search


def points(reports):
  """[Point] of each decoder and search with a latency and a BLEU.

  Args:
    reports: [(label, path of a benchmark.py JSON report)]; a label may
      name several reports (one model served several ways).
  Returns:
    The points, each report's by CPU time; a shortlist's or a `vmap`'s
    decoder is named with the report's (K, N), greedy search with
    "greedy".
  """
  found = []
  for label, path in reports:
    with open(path, encoding="utf-8") as f:
      serving = json.load(f)["serving"]
    table = ",".join(map(str, serving.get("shortlist") or ()))
    bleu = {(row["search"], row["decoder"]): row["bleu"]
            for row in serving["throughput"] if row.get("bleu") is not None}
    mine = []
    for row in serving["latency"]:
      key = (row["search"], row["decoder"])
      if key in bleu:
        name = row["decoder"] + (f" {table}" if table and (
            "shortlist" in row["decoder"] or "vmap" in row["decoder"])
                                 else "")
        name += " greedy" if row["search"] == "greedy" else ""
        mine.append(Point(label, name, row["cpu_ms"], bleu[key]))
    found += sorted(mine, key=lambda p: p.cpu_ms)
  return found


def draw(found, path, title=""):
  """Writes `found` (Points) as a scatter PNG at `path`: CPU ms on a log
  axis, BLEU up, one colour a model, each point named by its decoder."""
  figure = plots._figure(8, 5)  # pylint: disable=protected-access
  axes = figure.add_subplot()
  for k, model in enumerate(dict.fromkeys(p.model for p in found)):
    mine = [p for p in found if p.model == model]
    axes.scatter([p.cpu_ms for p in mine], [p.bleu for p in mine],
                 color=f"C{k}", label=model)
    for p in mine:
      axes.annotate(p.decoder.replace("savedmodel", "SavedModel")
                    .replace("_", " "), (p.cpu_ms, p.bleu), fontsize=6,
                    xytext=(3, 3), textcoords="offset points")
  from matplotlib import ticker  # pylint: disable=g-import-not-at-top
  axes.set_xscale("log")
  plain = ticker.FuncFormatter(lambda value, _: f"{value:g}")
  axes.xaxis.set_major_formatter(plain)
  axes.xaxis.set_minor_formatter(plain)
  axes.margins(x=0.12)
  axes.set_xlabel("one sentence, CPU ms (one thread; log scale)")
  axes.set_ylabel("test BLEU")
  axes.grid(True, alpha=0.3)
  axes.legend()
  if title:
    axes.set_title(title, fontsize=9)
  figure.savefig(path)
