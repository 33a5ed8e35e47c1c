"""bin/translate.py and bin/evaluate.py as a user runs them, on a
checkpoint and on its export."""

import contextlib
import io
import os
import pty
import re
import select
import subprocess
import sys
import time

import numpy as np
import pytest
import sacrebleu

from tf_transformer import evaluation
from tf_transformer.data.text_batches import in_input_order, length_batches
from tf_transformer.translators.translator import Translator
from tf_transformer.serving.output import one_line
from conftest import REPO, load_saved_model, run_script, start_script
import rounding
from search_reference import lines_apart

SOURCES = ["four hundred and twenty-one", "seven", "thirty thousand and two"]
# The untrained export's outputs: of at most input + 8 tokens.
OFFSET = 8


@pytest.fixture(scope="module")
def models(untrained_export):
  """(run directory, export) of an untrained model; outputs of input + 8."""
  return untrained_export


@pytest.fixture(scope="module")
def export_output(models):
  """translate.py --show_scores of SOURCES through the export: its stdout."""
  result = run_script("translate.py", f"--model={models[1]}", "--show_scores",
                      input_text="".join(s + "\n" for s in SOURCES))
  assert result.returncode == 0, result.stderr[-2000:]
  return result.stdout


@pytest.fixture(scope="module")
def reference(models):
  """(model, vocabulary, the SOURCES' ids, and how far two printed scores
  of the export's outputs may be apart, line by line: each printed to 4
  decimals (5e-5) from one of two paths (another batch, another graph),
  each within its float32 bound (rounding.py))."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from tf_transformer.data import sequences  # pylint: disable=g-import-not-at-top
  from tf_transformer.run import run_dir  # pylint: disable=g-import-not-at-top
  model_dir, exported = models
  model, vocab = run_dir.load_trained_model(str(model_dir))
  source_ids = sequences.source_ids(vocab, tf.constant(SOURCES)).to_tensor()
  outputs = load_saved_model(exported).signatures["ids"](
      source_ids=source_ids)["target_ids"]
  sources = rounding.unpadded(source_ids)
  bound = 2 * 5e-5 + 2 * rounding.output_bounds(model, sources,
                                                rounding.unpadded(outputs))
  return model, vocab, sources, bound


def _same_translations(reference, first, second):
  """Asserts that two paths' translations (texts) of SOURCES differ only
  at near ties of the search (tests/search_reference.py); the lines where
  they agree."""
  import sentencepiece as spm  # pylint: disable=g-import-not-at-top
  model, vocab, sources, _ = reference
  processor = spm.SentencePieceProcessor(model_proto=vocab.model_proto)
  encoded = lambda texts: [[processor.encode(t)] for t in texts]
  apart = lines_apart(model, sources, encoded(first), encoded(second),
                      alpha=model.config.decoding.length_penalty_alpha,
                      max_length_offset=OFFSET)
  return np.array([line not in apart for line in range(len(first))])


def _scored_lines(stdout):
  """(scores, translations) of --show_scores lines "score<TAB>text"."""
  lines = stdout.splitlines()
  assert all(re.match(r"-?\d+\.\d{4}\t", l) for l in lines), lines
  return ([float(l.split("\t", 1)[0]) for l in lines],
          [l.split("\t", 1)[1] for l in lines])


@pytest.mark.slow
@pytest.mark.numeric
def test_checkpoint_and_export_translate_alike(models, export_output,
                                               reference):
  model_dir, exported = models
  stdin = "".join(s + "\n" for s in SOURCES)
  from_checkpoint = run_script("translate.py", f"--model_dir={model_dir}",
                               "--max_length_offset=8", "--show_scores",
                               input_text=stdin)
  # Batched by tokens (the default) or one sentence a batch in file order:
  # the same lines in the same order.
  one_by_one = run_script("translate.py", f"--model={exported}",
                          "--show_scores", "--batch_tokens=0",
                          "--batch_size=1", input_text=stdin)
  for result in (from_checkpoint, one_by_one):
    assert result.returncode == 0, result.stderr[-2000:]
  scores, translations = _scored_lines(export_output)
  assert len(translations) == 3
  # The same translations but at near ties; the same scores within
  # rounding (`reference`).
  for other in (from_checkpoint, one_by_one):
    other_scores, other_translations = _scored_lines(other.stdout)
    same = _same_translations(reference, translations, other_translations)
    rounding.assert_within(np.array(other_scores)[same],
                           np.array(scores)[same], reference[3][same])


@pytest.mark.slow
@pytest.mark.numeric
def test_alignment_lines_from_an_export_and_a_checkpoint(models,
                                                         export_output,
                                                         reference):
  """--alignment appends ' ||| ' and word pairs to the same translation and
  score, from the export's alignment signature or the run; every pair is
  inside both lines' words, and every translation word is aligned."""
  model_dir, exported = models
  stdin = "".join(s + "\n" for s in SOURCES)
  aligned = run_script("translate.py", f"--model={exported}",
                       "--show_scores", "--alignment", input_text=stdin)
  by_layer_1 = run_script("translate.py", f"--model_dir={model_dir}",
                          "--max_length_offset=8", "--alignment",
                          "--alignment_layer=1", input_text=stdin)
  for result in (aligned, by_layer_1):
    assert result.returncode == 0, result.stderr[-2000:]
  scores, lines = _scored_lines(aligned.stdout)
  plain_scores, translations = _scored_lines(export_output)
  # The alignment signature searches apart from serving_default (another
  # graph); the run in process: the same lines but at near ties.
  same = _same_translations(reference, translations,
                            [line.split(" ||| ")[0] for line in lines])
  rounding.assert_within(np.array(scores)[same], np.array(plain_scores)[same],
                         reference[3][same])
  _same_translations(reference, translations, [
      line.split(" ||| ")[0] for line in by_layer_1.stdout.splitlines()])
  for output in (lines, by_layer_1.stdout.splitlines()):
    assert len(output) == len(SOURCES)
    for source, line in zip(SOURCES, output):
      translation, pairs = line.split(" ||| ")
      pairs = [tuple(map(int, p.split("-"))) for p in pairs.split()]
      assert all(0 <= s < len(source.split()) and
                 0 <= t < len(translation.split()) for s, t in pairs), line
      assert {t for _, t in pairs} == set(range(len(translation.split())))


def test_length_batches_fit_the_token_budget():
  lengths = [3, 9, 4, 9, 2, 30, 5, 5]
  batches = length_batches(lengths, batch_tokens=20, max_sentences=3)
  assert sorted(i for b in batches for i in b) == list(range(len(lengths)))
  assert batches[0] == [5]  # longer than the budget: alone, and first
  for batch in batches[1:]:
    assert max(lengths[i] for i in batch) * len(batch) <= 20
    assert len(batch) <= 3
  # Sorted: each batch's texts are no longer than the previous batch's.
  longest = [max(lengths[i] for i in b) for b in batches]
  assert longest == sorted(longest, reverse=True)
  assert length_batches([], 20, 3) == []


def test_results_are_yielded_in_input_order_as_soon_as_ready():
  """Each result comes out once every input before it is done: a command
  writes while later batches run, and a failure loses nothing written."""
  ran = []

  def run(rows):
    ran.append(rows)
    if rows == [4]:
      raise RuntimeError("server down")
    return [f"out{r}" for r in rows]
  out = in_input_order(6, [[1, 3], [0, 2], [5], [4]], run)
  assert next(out) == "out0" and ran == [[1, 3], [0, 2]]
  assert [next(out), next(out), next(out)] == ["out1", "out2", "out3"]
  with pytest.raises(RuntimeError, match="server down"):
    next(out)  # input 4's batch runs after 5's: 5 waits for it
  assert list(in_input_order(0, [], run)) == []
  with pytest.raises(ValueError, match="a batch of 2 inputs gave 1 results"):
    list(in_input_order(2, [[0, 1]], lambda rows: ["one"]))
  with pytest.raises(ValueError, match="input 1 is in no batch"):
    list(in_input_order(2, [[0]], lambda rows: ["one"]))


def test_translations_come_back_in_input_order_from_length_batches():
  """A fake search that echoes: whatever the batches, result i is text i,
  each batch is sorted by length, and the prefixes follow their texts."""
  seen = []

  def nbest_fn(texts):
    seen.append(list(texts))
    return [[t.encode()] for t in texts], [[0.0] for _ in texts]

  def prefix_fn(texts, prefixes):
    return [f"{p}|{t}".encode() for t, p in zip(texts, prefixes)], [0.0] * len(texts)
  texts = ["a b c d e", "a", "a b c", "a b", "a b c d e f g"]
  words = lambda texts: ([len(t.split()) for t in texts], 100)
  translator = Translator(nbest_fn, 1, words, prefix_fn, align_fn=None)
  results = translator.translate(texts, batch_size=2, batch_tokens=8)
  assert [r[0][0] for r in results] == texts
  assert all(len(batch) <= 2 for batch in seen)
  assert seen[0] == ["a b c d e f g"]
  prefixed = translator.translate(texts, prefixes=list("VWXYZ"),
                                  batch_tokens=8)
  assert [r[0][0] for r in prefixed] == [f"{p}|{t}" for p, t in
                                         zip("VWXYZ", texts)]


def test_nbest_lines(models, tmp_path):
  _, exported = models
  source = tmp_path / "in.txt"
  source.write_text("".join(s + "\n" for s in SOURCES))
  out = tmp_path / "out.txt"
  result = run_script("translate.py", f"--model={exported}", "--nbest=3",
                      f"--input={source}", f"--output={out}")
  assert result.returncode == 0, result.stderr[-2000:]
  lines = out.read_text().splitlines()
  assert len(lines) == 9
  for index in range(3):
    rows = [l.split(" ||| ") for l in lines[3 * index:3 * index + 3]]
    assert all(r[0] == str(index) and len(r) == 3 for r in rows)
    scores = [float(r[2]) for r in rows]
    assert scores == sorted(scores, reverse=True)


@pytest.mark.slow
def test_sampling_and_greedy_from_a_checkpoint(models):
  model_dir, _ = models
  stdin = "".join(s + "\n" for s in SOURCES)
  common = [f"--model_dir={model_dir}", "--max_length_offset=8"]
  sampled = [run_script("translate.py", *common, "--decoding=sample",
                        "--num_samples=2", "--nbest=2", "--temperature=1.5",
                        "--sampling_seed=5", input_text=stdin)
             for _ in range(2)]
  assert sampled[0].returncode == 0, sampled[0].stderr[-2000:]
  lines = sampled[0].stdout.splitlines()
  assert len(lines) == 6 and lines[0].startswith("0 ||| ")
  assert sampled[1].stdout == sampled[0].stdout  # the seed reproduces
  greedy = run_script("translate.py", *common, "--decoding=greedy",
                      input_text=stdin)
  one_token = run_script("translate.py", *common, "--decoding=sample",
                         "--top_k=1", input_text=stdin)
  assert greedy.returncode == 0, greedy.stderr[-2000:]
  assert len(greedy.stdout.splitlines()) == 3
  assert one_token.stdout == greedy.stdout
  too_many = run_script("translate.py", *common, "--decoding=greedy",
                        "--nbest=2", input_text=stdin)
  assert too_many.returncode == 1 and "--nbest=2" in too_many.stderr


@pytest.mark.slow
def test_evaluate_prints_sacrebleu_scores_with_signatures(models, tmp_path):
  _, exported = models
  source, reference = tmp_path / "src.txt", tmp_path / "ref.txt"
  source.write_text("".join(s + "\n" for s in SOURCES))
  references = ["vierhunderteinundzwanzig", "sieben", "dreißigtausendzwei"]
  reference.write_text("".join(r + "\n" for r in references))
  hypotheses_file = tmp_path / "hyp.txt"
  result = run_script("evaluate.py", f"--model={exported}",
                      f"--source={source}", f"--reference={reference}",
                      f"--output={hypotheses_file}", "--paper_bleu")
  assert result.returncode == 0, result.stderr[-2000:]
  hypotheses = hypotheses_file.read_text().splitlines()
  bleu = sacrebleu.corpus_bleu(hypotheses, [references])
  chrf = sacrebleu.corpus_chrf(hypotheses, [references])
  out = result.stdout
  assert f"BLEU = {bleu.score:.2f} (nrefs:1|case:mixed|eff:no|tok:13a" in out
  assert f"chrF = {chrf.score:.2f} (nrefs:1|" in out
  assert "exact_match = " in out and "(3 sentences)" in out
  assert "paper_bleu (tokenized, compound-split) = " in out
  assert out.count("BLEU = ") == 1  # the paper score is never called BLEU
  # Two references a sentence, as sacrebleu takes them; a second reference
  # of another length is named before any model loads.
  second = tmp_path / "ref2.txt"
  other = [hypotheses[0], "acht", "zwei"]
  second.write_text("".join(r + "\n" for r in other))
  both = run_script("evaluate.py", f"--model={exported}",
                    f"--source={source}", f"--reference={reference}",
                    f"--reference={second}", "--paper_bleu")
  assert both.returncode == 0, both.stderr[-2000:]
  bleu = sacrebleu.corpus_bleu(hypotheses, [references, other])
  assert f"BLEU = {bleu.score:.2f} (nrefs:2|" in both.stdout
  exact = sum(h in pair for h, pair in zip(hypotheses,
                                           zip(references, other))) / 3
  assert f"exact_match = {exact:.4f} (3 sentences)" in both.stdout
  second.write_text("acht\n")
  short = run_script("evaluate.py", "--model=/nonexistent/1",
                     f"--source={source}", f"--reference={reference}",
                     f"--reference={second}")
  assert short.returncode == 2
  assert (f"--source={source} has 3 lines but --reference={second} has 1"
          in short.stderr), short.stderr[-2000:]


def test_several_references_score_as_sacrebleu_scores_them():
  hypotheses = ["das Haus-Boot ist rot", "zwei Katzen", "ja"]
  first = ["das Haus-Boot ist blau", "drei Katzen", "ja"]
  second = ["ein Haus-Boot ist rot", "zwei Katzen", "nein"]
  both = evaluation.score(hypotheses, [first, second], True)
  assert both["bleu"] == pytest.approx(
      sacrebleu.corpus_bleu(hypotheses, [first, second]).score)
  assert both["chrf"] == pytest.approx(
      sacrebleu.corpus_chrf(hypotheses, [first, second]).score)
  assert "nrefs:2" in both["bleu_signature"]
  assert both["exact_match"] == pytest.approx(2 / 3)  # lines 2 and 3
  one = evaluation.score(hypotheses, first, True)
  assert one == evaluation.score(hypotheses, [first], True)
  assert both["bleu"] > one["bleu"] and both["paper_bleu"] > one["paper_bleu"]
  with pytest.raises(ValueError, match="3 translations for 2 references"):
    evaluation.score(hypotheses, [first, second[:2]])


@pytest.mark.numeric
def test_the_python_example_in_the_docs_runs(models, export_output,
                                             reference):
  """docs/decoding.md's "From Python" block, run on the fixtures' export
  and run: it prints what translate.py prints for the same sentences."""
  model_dir, exported = models
  with open(os.path.join(REPO, "docs", "decoding.md"), encoding="utf-8") as f:
    page = f.read()
  code = re.search(r"## From Python\n.*?```python\n(.*?)```", page,
                   re.S).group(1)
  code = code.replace('"saved_models/numbers/1"', repr(str(exported)))
  code = code.replace('"runs/numbers/averaged"', repr(str(model_dir)))
  printed = io.StringIO()
  with contextlib.redirect_stdout(printed):
    exec(compile(code, "docs/decoding.md", "exec"), {})  # pylint: disable=exec-used
  lines = printed.getvalue().splitlines()
  assert len(lines) == 4, lines
  scores, translations = _scored_lines(export_output)
  same = _same_translations(reference, translations[:2], [
      line.rsplit(" ", 1)[0] for line in lines[:2]])
  for line, score, bound in zip(np.array(lines[:2])[same],
                                np.array(scores[:2])[same],
                                reference[3][:2][same]):
    assert float(line.rsplit(" ", 1)[1]) == pytest.approx(score, abs=bound)
  assert 0.0 <= float(lines[2]) <= 1.0
  assert re.fullmatch(r"\[\(-[\d.e-]+, \[(-?[\d.e-]+(, )?)+\]\)\]", lines[3])


def test_paper_bleu_splits_compounds():
  assert evaluation.split_compounds("das Haus-Tür-Schloss , ja") == (
      "das Haus ##AT##-##AT## Tür ##AT##-##AT## Schloss , ja")
  text = ["Das ist ein Haus-Boot .", "Zwei Katzen"]
  assert evaluation.paper_bleu(text, text) == pytest.approx(100.0)
  scores = evaluation.score(["a b c d e", "x"], ["a b c d e", "y"], True)
  assert scores["exact_match"] == 0.5 and 0 < scores["bleu"] < 100


@pytest.mark.slow
def test_model_takes_a_run_as_well_as_an_export(models):
  """`--model` names an export or a run in every command: translate.py
  --model=RUN decodes as --model_dir=RUN does, decoding flags included."""
  model_dir, _ = models
  by_model, by_model_dir = (
      run_script("translate.py", f"--{flag}={model_dir}", "--beam_size=2",
                 "--show_scores", input_text="seven\nforty-two\n")
      for flag in ("model", "model_dir"))
  assert by_model.returncode == 0, by_model.stderr[-2000:]
  assert by_model.stdout == by_model_dir.stdout
  assert len(by_model.stdout.splitlines()) == 2


def test_usage_errors(models, tmp_path):
  model_dir, exported = models
  helped = run_script("translate.py", "--help")
  assert helped.returncode == 0
  for flag in ("--model", "--model_dir", "--beam_size", "--alpha"):
    assert f"\n  {flag}:" in helped.stdout, flag
  both = run_script("translate.py", f"--model={exported}",
                    f"--model_dir={model_dir}", input_text="seven\n")
  assert both.returncode != 0
  assert "exactly one of --model and --model_dir" in both.stderr
  fixed = run_script("translate.py", f"--model={exported}", "--beam_size=8",
                     input_text="seven\n")
  assert "fixed in an export" in fixed.stderr
  unknown = run_script("translate.py", "--no_such_flag")
  two_lines = [both, fixed, unknown]
  for bad in ("--alpha=-1", "--max_length_offset=0", "--beam_size=0",
              "--alignment_layer=2", "--alignment --nbest=2"):
    refused = run_script("translate.py", f"--model_dir={model_dir}",
                         *bad.split(), input_text="seven\n")
    flag = bad.split("=")[0].split()[0]
    assert refused.returncode != 0 and flag in refused.stderr, bad
    if "=" in bad:  # absl's validators
      two_lines.append(refused)
  # A refused flag or combination answers as an unknown flag does: two
  # lines, status 1, not the whole --help.
  for refused in two_lines:
    lines = refused.stderr.splitlines()
    assert refused.returncode == 1 and len(lines) == 2, refused.stderr
    assert lines[0].startswith("translate: error: "), lines
    assert lines[1] == "Pass --help to see the flags of translate.", lines
  source, reference = tmp_path / "s.txt", tmp_path / "r.txt"
  source.write_text("a\nb\n")
  reference.write_text("x\n")
  mismatch = run_script("evaluate.py", f"--model={exported}",
                        f"--source={source}", f"--reference={reference}")
  assert mismatch.returncode == 2
  assert "has 2 lines but" in mismatch.stderr and "has 1" in mismatch.stderr
  assert "Traceback" not in mismatch.stderr
  reference.write_bytes(b"x\ncaf\xe9\n")
  bad_utf8 = run_script("evaluate.py", f"--model={exported}",
                        f"--source={source}", f"--reference={reference}")
  assert bad_utf8.returncode == 2
  assert f"evaluate: error: {reference}:2: invalid UTF-8" in bad_utf8.stderr


def _read_line(stream, seconds=120):
  """One line from a subprocess' `stream`, or None if none came in time."""
  ready, _, _ = select.select([stream], [], [], seconds)
  return stream.readline() if ready else None


@pytest.mark.slow
@pytest.mark.numeric
def test_each_buffer_is_written_before_more_input_is_read(models,
                                                          export_output,
                                                          reference):
  """--buffer_lines=1: a translation comes out while its writer still holds
  stdin open (a program that feeds lines as they come)."""
  _, exported = models
  translate = subprocess.Popen(
      [sys.executable, os.path.join(REPO, "bin", "translate.py"),
       f"--model={exported}", "--show_scores", "--buffer_lines=1"],
      stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
      text=True, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"), cwd=REPO)
  try:
    translate.stdin.write(SOURCES[0] + "\n")
    translate.stdin.flush()
    first = _read_line(translate.stdout)
    assert first is not None, "no translation while stdin stays open"
    translate.stdin.write("".join(s + "\n" for s in SOURCES[1:]))
    translate.stdin.close()
    rest = translate.stdout.read()
    assert translate.wait(timeout=120) == 0, translate.stderr.read()[-2000:]
  finally:
    translate.kill()
  scores, translations = _scored_lines(first + rest)
  expected_scores, expected = _scored_lines(export_output)
  same = _same_translations(reference, expected, translations)
  rounding.assert_within(np.array(scores)[same],
                         np.array(expected_scores)[same], reference[3][same])


@pytest.mark.slow
def test_a_killed_translation_resumes_and_loses_no_line(models, tmp_path):
  """--resume: a translation killed part-way (a teacher's of a corpus)
  goes on from the lines its --output holds, a line cut short dropped, and
  ends as a whole run's file; an --output longer than --input is refused."""
  _, exported = models
  units = ("one", "two", "three", "four", "five", "six", "seven", "eight",
           "nine", "ten")
  lines = [f"{n} hundred and {m}" for n in units for m in units]  # 100
  source = tmp_path / "source.txt"
  source.write_text("".join(t + "\n" for t in lines), encoding="utf-8")
  args = [f"--model={exported}", f"--input={source}", "--buffer_lines=2"]
  whole = tmp_path / "whole.txt"
  assert run_script("translate.py", *args, f"--output={whole}").returncode == 0
  output = tmp_path / "output.txt"
  killed = start_script("translate.py", *args, f"--output={output}")
  deadline = time.time() + 300
  while killed.poll() is None and (not output.exists() or output.read_text(
      encoding="utf-8").count("\n") < 4):
    assert time.time() < deadline
    time.sleep(0.01)
  killed.kill()
  killed.wait()
  kept = output.read_text(encoding="utf-8").count("\n")
  assert 4 <= kept < len(lines)  # killed part-way
  with open(output, "a", encoding="utf-8") as f:
    f.write("a line cut sh")  # as a kill in the middle of a write leaves
  resumed = run_script("translate.py", *args, f"--output={output}",
                       "--resume")
  assert resumed.returncode == 0, resumed.stderr[-2000:]
  assert f"holds {kept:,} of {len(lines):,} lines" in resumed.stderr
  assert output.read_text(encoding="utf-8") == whole.read_text(
      encoding="utf-8")
  shorter = tmp_path / "shorter.txt"
  shorter.write_text("".join(t + "\n" for t in lines[:3]), encoding="utf-8")
  refused = run_script("translate.py", f"--model={exported}",
                       f"--input={shorter}", f"--output={output}", "--resume")
  assert refused.returncode == 1
  assert f"--output={output} holds 100 lines, more than" in refused.stderr


@pytest.mark.slow
def test_a_terminal_gets_each_line_as_it_is_typed(models, export_output):
  """Typed at a terminal (stdin a pseudo-terminal), a line is translated
  as soon as it is entered, with no progress lines; Ctrl-D ends."""
  _, exported = models
  terminal, stdin = pty.openpty()
  translate = subprocess.Popen(
      [sys.executable, os.path.join(REPO, "bin", "translate.py"),
       f"--model={exported}"], stdin=stdin, stdout=subprocess.PIPE,
      stderr=subprocess.PIPE, text=True,
      env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"), cwd=REPO)
  os.close(stdin)
  try:
    os.write(terminal, SOURCES[1].encode() + b"\n")
    line = _read_line(translate.stdout)
    assert line is not None, "no translation of a typed line"
    os.write(terminal, b"\x04")  # Ctrl-D: the end of the input
    assert translate.wait(timeout=120) == 0, translate.stderr.read()[-2000:]
    assert translate.stdout.read() == ""
    assert "translated" not in translate.stderr.read()
  finally:
    translate.kill()
    os.close(terminal)
  assert line == _scored_lines(export_output)[1][1] + "\n"


@pytest.mark.slow
def test_buffers_keep_nbest_indices_and_an_empty_input_makes_a_file(
    models, tmp_path):
  _, exported = models
  source, out = tmp_path / "in.txt", tmp_path / "out.txt"
  source.write_text("".join(s + "\n" for s in SOURCES))
  result = run_script("translate.py", f"--model={exported}", "--nbest=2",
                      "--buffer_lines=2", f"--input={source}",
                      f"--output={out}")
  assert result.returncode == 0, result.stderr[-2000:]
  indices = [line.split(" ||| ")[0] for line in out.read_text().splitlines()]
  assert indices == ["0", "0", "1", "1", "2", "2"]
  refused = run_script("translate.py", f"--model={exported}", "--nbest=99",
                       f"--input={source}", f"--output={tmp_path / 'no'}")
  assert refused.returncode == 1 and "--nbest=99" in refused.stderr
  assert not (tmp_path / "no").exists()  # refused before any output
  source.write_text("")
  result = run_script("translate.py", f"--model={exported}",
                      f"--input={source}", f"--output={out}")
  assert result.returncode == 0 and out.read_text() == ""


def test_a_translation_with_line_breaks_stays_on_its_line():
  assert one_line("vier\nhundert\r\nzwei") == "vier hundert zwei"
  assert one_line("") == ""


@pytest.mark.slow
def test_empty_and_over_long_lines_are_warned_about(models, tmp_path):
  """The CLI says which lines it cannot translate as given, from an export
  and from a checkpoint; the output stays one line per input."""
  model_dir, exported = models
  long_line = "four hundred and twenty-one " * 100  # over 256 subwords
  stdin = f"seven\n\n{long_line}\n  \n"
  for model in ([f"--model={exported}"],
                [f"--model_dir={model_dir}", "--max_length_offset=4"]):
    result = run_script("translate.py", *model, input_text=stdin)
    assert result.returncode == 0, result.stderr[-2000:]
    assert len(result.stdout.splitlines()) == 4
    warnings = [l for l in result.stderr.splitlines()
                if l.startswith("translate: warning: ")]
    assert len(warnings) == 2, result.stderr
    assert warnings[0] == (
        "translate: warning: lines 2, 4 of stdin are empty; their "
        "translation is whatever the model says for nothing")
    match = re.match(r"translate: warning: line 3 of stdin is longer than "
                     r"the model's input limit of 256 subwords \(up to "
                     r"([\d,]+)\) and will be cut to the first 256",
                     warnings[1])
    assert match and int(match.group(1).replace(",", "")) > 256, warnings[1]
  quiet = run_script("translate.py", f"--model={exported}",
                     input_text="seven\n")
  assert "warning" not in quiet.stderr


def test_evaluate_names_its_source_file_in_warnings(models, tmp_path):
  _, exported = models
  source, reference = tmp_path / "src.txt", tmp_path / "ref.txt"
  source.write_text("seven\n\n")
  reference.write_text("sieben\nnichts\n")
  result = run_script("evaluate.py", f"--model={exported}",
                      f"--source={source}", f"--reference={reference}")
  assert result.returncode == 0, result.stderr[-2000:]
  assert (f"evaluate: warning: line 2 of --source={source} is empty; its "
          "translation is whatever the model says for nothing"
          in result.stderr)
