"""Data: parallel corpora, the shared SentencePiece vocabulary, token batches.

raw text pairs (`corpora`: TFDS, local files, generated `numbers`)
-> shared subword vocabulary (`vocabulary`: SentencePiece, run in the graph)
-> length buckets and token-budget batches (`batching`), section 5.1;
and the batches of a file to translate, sorted by length (`text_batches`).
"""
