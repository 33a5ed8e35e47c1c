"""Scores of translations against references.

The headline numbers are sacrebleu's BLEU and chrF on detokenized output
against raw references, with their signatures. `paper_bleu` is the
paper-style score (section 6.1's 27.3 was computed on tokenized,
compound-split text): 13a tokenization, "Haus-Tür" split as
"Haus ##AT##-##AT## Tür", BLEU over those tokens. It is printed under its
own name and is never called BLEU.

`paired_p_value` says whether one system's lead over another on the same
sentences is beyond chance.
"""

import math
import re

import sacrebleu
from sacrebleu.significance import PairedTest
from sacrebleu.tokenizers.tokenizer_13a import Tokenizer13a

_COMPOUND = re.compile(r"(\S)-(\S)")


def split_compounds(text):
  """tensor2tensor's get_ende_bleu.sh compound splitting."""
  return _COMPOUND.sub(r"\1 ##AT##-##AT## \2", text)


def reference_sets(references):
  """`references` as sacrebleu takes them: a list of reference sets, each
  one line a sentence.

  Args:
    references: one set (a list of strings) or several (a list of lists).
  Returns:
    A list of reference sets (lists of strings), one set where one is given.
  """
  if references and not isinstance(references[0], str):
    return [list(one) for one in references]
  return [list(references)]


def paper_bleu(hypotheses, references):
  """The paper-style BLEU of `hypotheses` against `references` (one set or
  several, `reference_sets`)."""
  tokenize = Tokenizer13a()
  prepare = lambda lines: [split_compounds(tokenize(t)) for t in lines]
  return sacrebleu.metrics.BLEU(tokenize="none").corpus_score(
      prepare(hypotheses),
      [prepare(one) for one in reference_sets(references)]).score


def score(hypotheses, references, with_paper_bleu=False):
  """Corpus scores of translations.

  Args:
    hypotheses: the translations, one a sentence.
    references: one reference set (a string a sentence) or several (a list
      of such sets, as sacrebleu and its command line take several
      references: each sentence scores against all of its references).
    with_paper_bleu: add "paper_bleu".
  Returns:
    {"bleu", "bleu_signature", "chrf", "chrf_signature", "exact_match"
    (the share of sentences equal to one of their references)
    [, "paper_bleu"]}. Raises ValueError where a set's count differs.
  """
  sets = reference_sets(references)
  for one in sets:
    if len(hypotheses) != len(one):
      raise ValueError(f"{len(hypotheses)} translations for {len(one)} "
                       "references")
  bleu, chrf = sacrebleu.metrics.BLEU(), sacrebleu.metrics.CHRF()
  result = {
      "bleu": bleu.corpus_score(hypotheses, sets).score,
      "bleu_signature": str(bleu.get_signature()),
      "chrf": chrf.corpus_score(hypotheses, sets).score,
      "chrf_signature": str(chrf.get_signature()),
      "exact_match": sum(h in refs for h, refs in zip(hypotheses, zip(*sets)))
                     / max(len(hypotheses), 1)}
  if with_paper_bleu:
    result["paper_bleu"] = paper_bleu(hypotheses, sets)
  return result


# The paired test of each metric that `paired_p_value` takes, by name.
PAIRED_TESTS = {"bleu": "paired bootstrap",
                "exact_match": "McNemar's exact test"}


def paired_p_value(metric, baseline, system, references):
  """The p-value of `system`'s difference from `baseline` on `metric`, both
  translating the same sentences: the chance of a difference at least as
  large between two systems of equal quality.

  BLEU: sacrebleu's paired bootstrap resampling (Koehn, 2004; 1,000
  resamples, sacrebleu's fixed seed, so the same translations give the same
  p). Exact match: McNemar's exact test, two-sided, over the sentences that
  one system gets right and the other wrong.

  Args:
    metric: a key of `PAIRED_TESTS`: "bleu" or "exact_match".
    baseline: translations, one a sentence.
    system: translations of the same sentences.
    references: one a sentence.

  Returns:
    A p-value in (0, 1]; 1.0 where both score the same (sacrebleu's
    resampling test, which never calls a zero difference chance, would give
    its smallest p where no resample differs either).
  """
  if metric not in PAIRED_TESTS:
    raise ValueError(f"{metric!r}: a paired test is for "
                     f"{' or '.join(map(repr, PAIRED_TESTS))}")
  if not len(baseline) == len(system) == len(references):
    raise ValueError(f"{len(baseline)} and {len(system)} translations for "
                     f"{len(references)} references")
  if metric == "bleu":
    _, results = PairedTest([("baseline", baseline), ("system", system)],
                            {"BLEU": sacrebleu.metrics.BLEU()}, [references],
                            test_type="bs", n_samples=1000)()
    baseline_result, system_result = results["BLEU"]
    if system_result.score == baseline_result.score:
      return 1.0
    return system_result.p_value
  only_baseline = sum(b == r != s for b, s, r in
                      zip(baseline, system, references))
  only_system = sum(s == r != b for b, s, r in
                    zip(baseline, system, references))
  discordant = only_baseline + only_system
  tail = sum(math.comb(discordant, k)
             for k in range(min(only_baseline, only_system) + 1))
  return min(1.0, 2 * tail / 2 ** discordant)
