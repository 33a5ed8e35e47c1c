"""Fixed token ids shared by the vocabulary, the model, the loss and decoding.

The SentencePiece model is trained with exactly these ids, so every part of the
system can rely on them without reading the vocabulary file.
"""

PAD_ID = 0  # padding; never attended to, never scored by the loss
UNK_ID = 1  # unknown piece
BOS_ID = 2  # begins every decoder input (the target shifted right, section 3.1)
EOS_ID = 3  # ends every target sequence; decoding stops on it

# Never an output token, whatever a model's probabilities: every search masks
# them (an untrained model may favour them, and a PAD input to the cached
# decoder step would be attended to where teacher forcing masks it).
NEVER_OUTPUT = (PAD_ID, BOS_ID)


def never_output(decoder_start="bos"):
  """The ids a model's searches never output: NEVER_OUTPUT; only PAD where
  the decoder starts from a zero vector (`ModelConfig.decoder_start`
  "zero"), whose BOS_ID is an ordinary piece.

  Args:
    decoder_start: the model's "bos" or "zero".
  Returns:
    A tuple of ids.
  """
  return NEVER_OUTPUT if decoder_start == "bos" else (PAD_ID,)
