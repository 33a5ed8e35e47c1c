"""Sequence-level distillation's teacher pass (run/distillation.py): the
teacher's best translation of each training source, line for line, in
buffers written whole, resumed from the whole lines a stopped run left."""

import pytest

from tf_transformer.run import distillation


class _Teacher:
  """A translator that upper-cases, recording its calls."""

  def __init__(self):
    self.calls = []

  def translate(self, texts, nbest, batch_size, progress=None,
                prefixes=None, batch_tokens=0):
    del batch_size, prefixes, batch_tokens
    assert nbest == 1
    self.calls.append(list(texts))
    if progress:
      progress.add(len(texts))
    return [[(text.upper().replace("|", "\n"), -1.0)] for text in texts]


def test_the_teachers_best_line_for_line_resumed_where_it_stopped(tmp_path):
  lines = [f"line {i}" for i in range(25)] + ["two|lines"]
  source = tmp_path / "train.en"
  source.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
  output = tmp_path / "student" / "data" / "train.distilled.de"
  want = [line.upper().replace("|", " ") for line in lines]
  teacher = _Teacher()
  assert distillation.distill(teacher, str(source), str(output),
                              buffer_lines=10) == 26
  assert output.read_text(encoding="utf-8").splitlines() == want
  assert [len(call) for call in teacher.calls] == [10, 10, 6]
  # Stopped after a buffer, its last line cut short by the kill.
  output.write_text("".join(line + "\n" for line in want[:10]) + "LINE 1",
                    encoding="utf-8")
  teacher = _Teacher()
  assert distillation.distill(teacher, str(source), str(output),
                              buffer_lines=10) == 16
  assert teacher.calls[0][0] == "line 10"
  assert output.read_text(encoding="utf-8").splitlines() == want
  assert distillation.distill(_Teacher(), str(source), str(output)) == 0
  other = tmp_path / "other.en"
  other.write_text("a\nb\nc\n", encoding="utf-8")
  with pytest.raises(ValueError, match=r"holds 26 lines, more than .*other"
                     r"\.en's 3: another corpus's"):
    distillation.distill(_Teacher(), str(other), str(output))
