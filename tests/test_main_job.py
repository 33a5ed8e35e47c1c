"""bin/main_job.py runs every stage with the repository's own commands and
ends with a summary. (Short runs: the full jobs' figures are in docs/recipes.md.
Run again, the job resumes through train.py's tested resume and exports the
next version through export.py's tested versioning; a second run here would
add a minute to the suite.)"""

import gzip
import os
import re

import pytest

from conftest import REPO, run_script


def test_main_job_end_to_end(tmp_path):
  args = [f"--work_dir={tmp_path / 'work'}",
          f"--export_dir={tmp_path / 'saved_models' / 'numbers'}",
          "--numbers_train_size=2000", "--train_steps=30",
          "--vocab_size=400", "--average_checkpoints=2", "--num_examples=3",
          "--hparams=max_decode_length_offset=4"]  # short untrained outputs
  first = run_script("main_job.py", *args, timeout=900)
  assert first.returncode == 0, first.stderr[-3000:]
  out = first.stdout
  for stage in ("prepare", "train", "average", "export", "evaluate dev",
                "evaluate test", "translate"):
    assert f"\n== {stage}: " in out, stage
  assert "step 3/30 loss" in out and "step 30/30 loss" in out  # progress
  assert "using the vocabulary already in" in out  # prepare's, not rebuilt
  assert re.search(r"trained +tiny model to step 30, last loss [\d.]+", out)
  assert "averaged 2 checkpoints: ckpt-27, ckpt-30" in out
  assert f"exported   {tmp_path}/saved_models/numbers/1" in out
  for split in ("dev", "test"):
    assert re.search(rf"{split} +exact match [01]\.\d{{4}}  chrF [\d.]+", out)
  examples = out.split("(source | translation | reference):\n")[1]
  rows = [line for line in examples.splitlines() if line.startswith("  ")]
  assert len(rows) == 3 and all(line.count(" | ") == 2 for line in rows)
  assert (tmp_path / "saved_models" / "numbers" / "1" /
          "saved_model.pb").exists()
  assert len((tmp_path / "work" / "test.translation").read_text()
             .splitlines()) == 500



MULTI30K = os.environ.get("MULTI30K_DIR", os.path.join(
    os.path.dirname(REPO), "shared", "data", "multi30k"))


def _cut_multi30k(directory, sizes=(("train", 300), ("val", 40),
                                     ("test_2016_flickr", 40))):
  """The first lines of each Multi30k file, gzipped like the originals."""
  directory.mkdir()
  for stem, lines in sizes:
    for language in ("en", "de"):
      with gzip.open(os.path.join(MULTI30K, f"{stem}.{language}.gz"),
                     "rt", encoding="utf-8") as f:
        head = [next(f) for _ in range(lines)]
      with gzip.open(directory / f"{stem}.{language}.gz", "wt",
                     encoding="utf-8") as f:
        f.write("".join(head))
  return directory


@pytest.mark.skipif(not os.path.isdir(MULTI30K), reason=(
    f"the Multi30k captions are not at {MULTI30K} (set MULTI30K_DIR to the "
    "folder with train/val/test_2016_flickr .en.gz/.de.gz)"))
def test_main_job_multi30k_on_a_few_hundred_captions(tmp_path):
  data_dir = _cut_multi30k(tmp_path / "multi30k")
  args = [f"--work_dir={tmp_path / 'work'}",
          f"--export_dir={tmp_path / 'saved_models' / 'multi30k'}",
          "--task=multi30k", f"--data_dir={data_dir}", "--train_steps=10",
          "--vocab_size=600", "--average_checkpoints=2", "--num_examples=2",
          "--hparams=num_layers=1,d_model=64,d_ff=128,"
          "max_decode_length_offset=4"]
  result = run_script("main_job.py", *args, timeout=900)
  assert result.returncode == 0, result.stderr[-3000:]
  out = result.stdout
  assert "--train_source=" in out and "--train_minutes=20" in out
  assert re.search(r"trained +small_corpus model to step 10, last loss", out)
  assert "averaged 2 checkpoints: ckpt-9, ckpt-10" in out
  for split, source in (("dev", "val.en"), ("test", "test_2016_flickr.en")):
    assert re.search(rf"{split} +exact match [01]\.\d{{4}}  chrF [\d.]+  "
                     rf"BLEU [\d.]+  \({source}\)", out), split
  examples = out.split("(source | translation | reference):\n")[1]
  rows = [line for line in examples.splitlines() if line.startswith("  ")]
  assert len(rows) == 2 and rows[0].startswith(
      "  A man in an orange hat starring at something. | ")
  assert len((tmp_path / "work" / "test.translation").read_text()
             .splitlines()) == 40
  assert (tmp_path / "work" / "data" / "train.de").read_text(
      encoding="utf-8").count("\n") == 300


def test_main_job_multi30k_names_what_is_missing(tmp_path):
  result = run_script("main_job.py", "--task=multi30k",
                      f"--work_dir={tmp_path / 'work'}")
  assert result.returncode == 1
  assert "main_job: error: --task=multi30k needs --data_dir" in result.stderr
  (tmp_path / "empty").mkdir()
  result = run_script("main_job.py", "--task=multi30k",
                      f"--data_dir={tmp_path / 'empty'}",
                      f"--work_dir={tmp_path / 'work'}")
  assert result.returncode == 1
  assert (f"main_job: error: --data_dir={tmp_path / 'empty'} has no "
          "train.en.gz or train.en" in result.stderr)
  helped = run_script("main_job.py", "--help")
  assert helped.returncode == 0 and "--data_dir" in helped.stdout
