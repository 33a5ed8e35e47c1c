"""Bad data input: an error naming the file and line or the flag, or skips
that are counted. Plus the TFDS path, offline, through tfds mock data."""

import json
import os

import keras
import pytest
import tensorflow as tf
import tensorflow_datasets as tfds

from tf_transformer.data import batching
from tf_transformer.data import corpora
from tf_transformer.data import numbers
from tf_transformer.data import prepare
from tf_transformer.data import sources
from tf_transformer.data import tfds_corpora
from tf_transformer.data import vocabulary as vocabulary_lib
from tf_transformer.data.errors import DataError
from conftest import run_script


def _write(path, content):
  mode = "wb" if isinstance(content, bytes) else "w"
  with open(path, mode) as f:
    f.write(content)
  return str(path)


def _read(*args):
  return list(corpora.read_local(*args))


def test_missing_file(tmp_path):
  source = _write(tmp_path / "a.en", "one\n")
  with pytest.raises(DataError, match=r"b\.de: no such file"):
    _read(source, str(tmp_path / "b.de"))


@pytest.mark.parametrize("source, target, message", [
    ("a\nb\nc\n", "x\ny\n", r"t\.txt has 2 lines but .*s\.txt has more "
     r"\(line 3 has no translation\)"),
    ("a\n", "x\ny\n", r"s\.txt has 1 lines but .*t\.txt has more \(line 2 "
     r"has no source\)"),
])
def test_different_line_counts(tmp_path, source, target, message):
  with pytest.raises(DataError, match=message):
    _read(_write(tmp_path / "s.txt", source), _write(tmp_path / "t.txt",
                                                     target))


def test_empty_lines_are_skipped_and_counted(tmp_path):
  stats = corpora.ReadStats()
  pairs = list(corpora.read_local(
      _write(tmp_path / "s.txt", "a\n\nc\n  \n"),
      _write(tmp_path / "t.txt", "x\ny\n\nw\n"), stats))
  assert pairs == [("a", "x")]
  assert stats.pairs == 1 and stats.skipped["empty side"] == 3


def test_invalid_utf8_names_file_and_line(tmp_path):
  source = _write(tmp_path / "s.txt", b"good\nbad \xff\xfe here\n")
  target = _write(tmp_path / "t.txt", "gut\nschlecht\n")
  with pytest.raises(DataError, match=r"s\.txt:2: invalid UTF-8"):
    _read(source, target)


def test_empty_corpus(tmp_path):
  with pytest.raises(DataError, match="no sentence pairs"):
    _read(_write(tmp_path / "s.txt", ""), _write(tmp_path / "t.txt", ""))
  with pytest.raises(DataError, match="no sentence pairs"):
    _read(_write(tmp_path / "p.tsv", "\n\n"))


def test_tsv_pairs_and_bad_tsv_line(tmp_path):
  assert _read(_write(tmp_path / "p.tsv", "a\tx\n\nb\ty\n")) == [("a", "x"),
                                                                 ("b", "y")]
  with pytest.raises(DataError, match=r"bad\.tsv:2: expected 2 tab-separated"
                     r" fields .* found 3"):
    _read(_write(tmp_path / "bad.tsv", "a\tx\nb\ty\tz\n"))


def test_unknown_dataset_names_the_flag():
  with pytest.raises(DataError, match=r"--dataset=no_such_corpus: no such "
                     "TFDS dataset"):
    list(tfds_corpora.read_tfds("no_such_corpus", "train", "en", "de"))


def test_conflicting_and_missing_data_flags(tmp_path):
  with pytest.raises(DataError, match="both given"):
    sources.DataSpec(dataset="numbers", train_source="x").check()
  with pytest.raises(DataError, match="no training data"):
    sources.DataSpec(dataset="").check()
  with pytest.raises(DataError, match="--dev_source: no dev data"):
    sources.text_pairs(sources.DataSpec(dataset="", train_source="x"), "dev")


def test_budget_smaller_than_a_sentence():
  pairs = tf.data.Dataset.from_tensors(([5, 3], [6]))
  with pytest.raises(DataError, match="--batch_tokens=16 cannot hold one "
                     "sentence of --max_length=64"):
    batching.token_batches(pairs, 16, 64)


def test_tfds_translation_in_both_directions_offline():
  with tfds.testing.mock_data(num_examples=6,
                              policy=tfds.testing.MockPolicy.USE_CODE):
    pt_en = list(tfds_corpora.read_tfds("ted_hrlr_translate/pt_to_en",
                                        "train", "pt", "en"))
    en_pt = list(tfds_corpora.read_tfds("ted_hrlr_translate/pt_to_en",
                                        "train", "en", "pt"))
    wmt = list(tfds_corpora.read_tfds("wmt14_translate/de-en", "train", "en",
                                      "de"))
  assert pt_en and wmt
  assert all(isinstance(s, str) and isinstance(t, str) for s, t in wmt)
  assert [(t, s) for s, t in pt_en] == en_pt
  with pytest.raises(DataError, match=r"--target_language=fr: "
                     r"wmt14_translate/de-en has languages \('de', 'en'\)"):
    list(tfds_corpora.read_tfds("wmt14_translate/de-en", "train", "en", "fr"))


def test_tfds_download_failure_says_how_to_work_offline(tmp_path, monkeypatch):
  def no_network(*args, **kwargs):
    raise ConnectionError("network is unreachable")
  monkeypatch.setattr(tfds.core.DatasetBuilder, "download_and_prepare",
                      no_network)
  with pytest.raises(DataError) as error:
    list(tfds_corpora.read_tfds("wmt14_translate/de-en", "train", "en", "de",
                                data_dir=str(tmp_path)))
  message = str(error.value)
  assert "network is unreachable" in message
  assert "TFDS needs the internet" in message and "--data_dir" in message


def test_vocabulary_survives_set_random_seed(tmp_path):
  """tensorflow/text issue 570: set_random_seed kills eager resources."""
  vocabulary = vocabulary_lib.Vocabulary(vocabulary_lib.train(
      ["ein zwei drei vier fünf"] * 20, 300))
  before = vocabulary.tokenize("zwei drei").numpy().tolist()
  keras.utils.set_random_seed(5)
  assert vocabulary.tokenize("zwei drei").numpy().tolist() == before


def test_a_smaller_vocabulary_than_asked_is_said(caplog):
  caplog.set_level("INFO")
  spec = sources.DataSpec(dataset="numbers", numbers_train_size=300)
  vocabulary = prepare.build_vocabulary(spec, 5000)
  assert vocabulary.vocab_size < 5000
  assert any(f"the vocabulary has {vocabulary.vocab_size} pieces, not "
             "5000: SentencePiece found no more pieces" in r.getMessage()
             for r in caplog.records)


def test_missing_vocabulary_says_how_to_build_one(tmp_path):
  with pytest.raises(DataError, match="prepare_data.py"):
    vocabulary_lib.Vocabulary.load(str(tmp_path))


def test_prepare_data_on_local_files(tmp_path):
  source = _write(tmp_path / "train.en", "".join(
      f"sentence number {i}\n" for i in range(300)) + "\n" + "x " * 400 + "\n")
  target = _write(tmp_path / "train.de", "".join(
      f"Satz Nummer {i}\n" for i in range(300)) + "leer\n" + "y " * 400 + "\n")
  out = tmp_path / "out"
  result = run_script("prepare_data.py", "--dataset=", f"--train_source={source}",
                      f"--train_target={target}", f"--output_dir={out}",
                      "--vocab_size=400", "--max_length=64")
  assert result.returncode == 0, result.stderr
  assert "train: pairs=301" in result.stdout
  assert "dropped: too_long(>64)=1 empty_side=1" in result.stdout
  assert "p50=" in result.stdout
  stats = json.load(open(out / "data_stats.json"))
  assert stats["train"]["pairs"] == 301
  assert json.load(open(out / "train.tokens.json"))["pairs"] == 301
  assert os.path.exists(out / "vocabulary.model")


@pytest.mark.slow
def test_train_takes_prepared_token_arrays_and_refuses_stale_ones(tmp_path):
  """bin/train.py on a bin/prepare_data.py directory tokenizes nothing
  again; once a raw file changes, the arrays are refused naming it."""
  source = _write(tmp_path / "train.en", "".join(
      f"sentence number {i}\n" for i in range(300)))
  target = _write(tmp_path / "train.de", "".join(
      f"Satz Nummer {i}\n" for i in range(300)))
  out = tmp_path / "out"
  data = ["--dataset=", f"--train_source={source}", f"--train_target={target}"]
  assert run_script("prepare_data.py", *data, f"--output_dir={out}",
                    "--vocab_size=400", "--max_length=32").returncode == 0
  manifest = json.load(open(out / "train.tokens.json"))
  assert manifest["pairs"] == 300 and manifest["dtype"] == "uint16"
  written = os.path.getmtime(out / "train.source.npy")
  train = ["train.py", f"--model_dir={out}", *data, "--config=tiny",
           "--max_length=32", "--batch_tokens=512", "--eval_every_steps=0",
           "--checkpoint_every_secs=0", "--alsologtostderr"]
  result = run_script(*train, "--train_steps=2")
  assert result.returncode == 0, result.stderr[-3000:]
  assert "using the token arrays and statistics bin/prepare_data.py left" in (
      result.stderr)
  assert "tokenized 300 train pairs" not in result.stderr
  assert os.path.getmtime(out / "train.source.npy") == written
  with open(target, "a", encoding="utf-8") as f:
    f.write("Satz Nummer 300\n")
  result = run_script(*train, "--train_steps=4")
  assert result.returncode == 2, result.stderr[-3000:]
  assert (f"error: {out}/train.tokens.json: the token arrays there are "
          f"stale: {target} changed since it was tokenized") in result.stderr


def test_prepare_data_writes_split_text_for_evaluate(tmp_path):
  result = run_script("prepare_data.py", "--dataset=numbers",
                      "--numbers_train_size=300", "--vocab_size=400",
                      f"--output_dir={tmp_path}", "--write_text=dev,test")
  assert result.returncode == 0, result.stderr[-2000:]
  expected = numbers.generate(dict(numbers.DEFAULT_SIZES, train=300))
  for split in ("dev", "test"):
    assert f"wrote {tmp_path}/{split}.en" in result.stdout
    english = (tmp_path / f"{split}.en").read_text().splitlines()
    german = (tmp_path / f"{split}.de").read_text().splitlines()
    assert list(zip(english, german)) == expected[split]
  bad = run_script("prepare_data.py", "--write_text=valid",
                   f"--output_dir={tmp_path}")
  assert bad.returncode != 0 and "--write_text" in bad.stderr


@pytest.mark.parametrize("args, message", [
    (["--dataset=", "--train_source=/nonexistent/a.en",
      "--train_target=/nonexistent/a.de"], "/nonexistent/a.en: no such file"),
    (["--dataset=nope_corpus"], "--dataset=nope_corpus: no such TFDS dataset"),
])
def test_prepare_data_errors_are_one_clear_line(tmp_path, args, message):
  result = run_script("prepare_data.py", *args, f"--output_dir={tmp_path}")
  assert result.returncode == 2
  assert message in result.stderr
  assert "Traceback" not in result.stderr
