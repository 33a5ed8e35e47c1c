"""bin/main_job.py runs every stage with the repository's own commands and
ends with a summary. (A short run: the full job's figures are in README.md.
Run again, the job resumes through train.py's tested resume and exports the
next version through export.py's tested versioning; a second run here would
add a minute to the suite.)"""

import re

from conftest import run_script


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

