"""Package data: `corpus.txt`, the generated English text of the ``lm_bandit`` task, and
`make_corpus`, the script that regenerates it byte for byte."""
