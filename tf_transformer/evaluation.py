"""Scores of translations against references.

The headline numbers are sacrebleu's BLEU and chrF on detokenized output
against raw references, with their signatures. `paper_bleu` is the
paper-style score (section 6.1's 27.3 was computed on tokenized,
compound-split text): 13a tokenization, "Haus-Tür" split as
"Haus ##AT##-##AT## Tür", BLEU over those tokens. It is printed under its
own name and is never called BLEU.
"""

import re

import sacrebleu
from sacrebleu.tokenizers.tokenizer_13a import Tokenizer13a

_COMPOUND = re.compile(r"(\S)-(\S)")


def split_compounds(text):
  """tensor2tensor's get_ende_bleu.sh compound splitting."""
  return _COMPOUND.sub(r"\1 ##AT##-##AT## \2", text)


def paper_bleu(hypotheses, references):
  tokenize = Tokenizer13a()
  prepare = lambda lines: [split_compounds(tokenize(t)) for t in lines]
  return sacrebleu.metrics.BLEU(tokenize="none").corpus_score(
      prepare(hypotheses), [prepare(references)]).score


def score(hypotheses, references, with_paper_bleu=False):
  """{"bleu", "bleu_signature", "chrf", "chrf_signature", "exact_match"
  [, "paper_bleu"]}."""
  if len(hypotheses) != len(references):
    raise ValueError(f"{len(hypotheses)} translations for {len(references)} "
                     "references")
  bleu, chrf = sacrebleu.metrics.BLEU(), sacrebleu.metrics.CHRF()
  result = {
      "bleu": bleu.corpus_score(hypotheses, [references]).score,
      "bleu_signature": str(bleu.get_signature()),
      "chrf": chrf.corpus_score(hypotheses, [references]).score,
      "chrf_signature": str(chrf.get_signature()),
      "exact_match": sum(h == r for h, r in zip(hypotheses, references))
                     / max(len(references), 1)}
  if with_paper_bleu:
    result["paper_bleu"] = paper_bleu(hypotheses, references)
  return result
