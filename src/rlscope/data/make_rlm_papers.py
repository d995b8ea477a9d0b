"""Generate `rlm_papers.jsonl`, the synthetic multi-paper dataset of the ``rlm_papers`` task
(COMPANIONS.md section 4, docs/companions.md "RLM")::

    python -m rlscope.data.make_rlm_papers --seed 0 --num_train 128 --num_eval 32
    python -m rlscope.data.make_rlm_papers --check   # exit 1 if the shipped file differs

One JSON object per line: ``{"id", "split", "question", "papers": {id: text}, "gold":
[{"paper_id", "start", "end", "text"}], "answer"}``. Each example has 3–5 fictional papers
(title, ``Abstract:``, ``## Introduction``, ``## Method``, ``## Experiments``,
``## Limitations``; 1.5–3k characters) filled from templates with invented method, technique,
dataset and metric names and values, plus distractor sentences that name the same entities
with other values (results of prior work, other datasets, other techniques). Question types,
drawn uniformly:

- ``lookup``: which papers report metric X on dataset D, and with what values; gold = every
  sentence in which a paper reports its own X on D (1–3 papers, each in its Experiments
  section and, half of the time, in its abstract);
- ``comparison``: which paper reports the highest X on D; gold = every reporting sentence, as
  for lookup (values distinct);
- ``attribution``: which paper introduces technique T and what limitation it states; gold =
  the introducing sentence and the limitation sentence of that paper.

Every gold span is a whole sentence (`sentence_spans`) and ``papers[pid][start:end] == text``.
Only `random.Random` with the given seed and lists are used, so the output is the same on every
machine.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

OUT = Path(__file__).with_name("rlm_papers.jsonl")
SECTIONS = ("Introduction", "Method", "Experiments", "Limitations")
ABSTRACT_LABEL = "Abstract: "
MIN_CHARS, MAX_CHARS = 1500, 3000

PREFIXES = ["Flux", "Corvo", "Lumen", "Strata", "Vesper", "Quill", "Nimbus", "Tessel", "Arbor",
            "Helix", "Onyx", "Pylon", "Sable", "Tidal", "Umbra", "Zephyr", "Kestrel", "Marrow",
            "Glyph", "Orrery", "Basalt", "Cinder", "Dune", "Ember", "Fjord", "Garnet"]
SUFFIXES = ["Net", "Former", "Mix", "Align", "Prompt", "Graph", "Flow", "Tune", "Route", "Fuse",
            "Span", "Lens"]
DATASETS = ["Corvid", "Heron", "Marten", "Lynx", "Osprey", "Ibis", "Vole", "Wren", "Tapir",
            "Gecko", "Bison", "Egret", "Puffin", "Stoat", "Newt", "Kiwi"]
METRICS = ["F-score", "exact match", "Q-accuracy", "span recall", "BLEU-R", "Tau-F1",
           "calibrated accuracy", "rank score", "hit rate", "edit similarity"]
TECHNIQUES = ["gated residual pooling", "contrastive span hashing", "adaptive token dropping",
              "curriculum rephrasing", "latent anchor replay", "sparse routing distillation",
              "dual-view masking", "entropy-guided pruning", "hierarchical memory caching",
              "bidirectional label smoothing", "recursive chunk voting", "tempered query expansion",
              "cross-document attention tying", "iterative evidence pinning",
              "shallow fusion reranking", "orthogonal prompt mixing", "lazy gradient routing",
              "confidence-weighted self-training"]
DOMAINS = ["multi-hop question answering", "document retrieval", "code summarisation",
           "table reasoning", "claim verification", "dialogue state tracking", "entity linking",
           "long-form summarisation", "scientific claim extraction", "citation recommendation"]
LIMITS = ["requires labelled validation data for every new domain",
          "scales quadratically with the number of input documents",
          "degrades sharply on inputs longer than four thousand tokens",
          "needs a separate calibration pass before deployment",
          "is sensitive to the choice of random seed",
          "assumes that every document is written in English",
          "doubles the memory footprint during training",
          "cannot be applied to models without access to their gradients",
          "underperforms when fewer than a hundred training examples are available",
          "relies on a hand-written list of stop phrases"]
PURPOSES = ["keeps only the evidence that matters", "reduces the cost of long inputs",
            "stabilises training on noisy labels", "links related passages across documents",
            "makes the model robust to paraphrased questions",
            "lets a small model match a larger one"]

FILLERS = {
    "Abstract": ["Our experiments cover several public benchmarks and two private ones.",
                 "Code and data will be released with the camera-ready version.",
                 "The approach needs no additional annotation of the training data.",
                 "It is simple to implement on top of existing encoders.",
                 "We also report a detailed analysis of the failure cases."],
    "Introduction": ["Progress in {domain} has been driven by ever larger models.",
                     "Most existing systems treat every input token alike.",
                     "This raises the question of where the computation should go.",
                     "We revisit this question with a deliberately simple design.",
                     "Our contributions are threefold and summarised below.",
                     "Section two describes the method and section three the experiments.",
                     "Earlier systems for {domain} rely on expensive retrieval steps.",
                     "A practical system must also be cheap to train and to serve.",
                     "Benchmarks in this area have grown steadily harder over the years.",
                     "Practitioners often report that published gains do not transfer.",
                     "We argue that careful engineering matters as much as scale.",
                     "The resulting system is easy to reproduce from this description.",
                     "Related work on {domain} is discussed where it is relevant."],
    "Method": ["{M} is trained end to end with a standard cross-entropy objective.",
               "The encoder is shared across all input documents of an example.",
               "We use a learning rate of 3e-4 with a linear warm-up of one epoch.",
               "All hidden layers have the same width and the same dropout rate.",
               "At inference time the model runs in a single forward pass.",
               "The design has two hyperparameters, both tuned on held-out data.",
               "Each component can be ablated independently of the others.",
               "The training set is shuffled once per epoch with a fixed seed.",
               "Inputs longer than the context window are split into overlapping chunks.",
               "Gradients are clipped to a norm of one throughout training.",
               "We keep an exponential moving average of the weights for evaluation.",
               "The vocabulary is shared between the encoder and the decoder.",
               "Batches are built so that every batch mixes short and long inputs."],
    "Experiments": ["All numbers are averages over three runs with different seeds.",
                    "We compare against the strongest published baselines we could run.",
                    "Hyperparameters were selected on the validation split only.",
                    "Training takes about a day on a single accelerator.",
                    "Variance across runs is small for every benchmark we consider.",
                    "The ablations confirm that each component contributes to the result.",
                    "Baselines were re-run with their authors' recommended settings.",
                    "We report test scores only for the final configuration.",
                    "Error analysis shows that most remaining mistakes involve rare entities.",
                    "Scores on the smaller benchmarks fluctuate more than on the larger ones."],
    "Limitations": ["We leave a study of multilingual inputs to future work.",
                    "Our evaluation is limited to English benchmarks.",
                    "The compute budget prevented a larger hyperparameter sweep.",
                    "We did not measure the energy cost of training."],
}


@dataclass
class Paper:
    """One paper under construction: its title and the sentences of each section."""

    method: str
    technique: str
    title: str
    sections: dict[str, list[str]]


def sentence_spans(text: str) -> list[tuple[int, int]]:
    """``(start, end)`` of every sentence of ``text``: each line is split after every ``". "``;
    a leading ``Abstract: `` label is not part of the first sentence; headings and the title
    are sentences of their own."""
    spans: list[tuple[int, int]] = []
    offset = 0
    for line in text.split("\n"):
        start = offset + (len(ABSTRACT_LABEL) if line.startswith(ABSTRACT_LABEL) else 0)
        end_of_line = offset + len(line)
        while start < end_of_line:
            cut = text.find(". ", start, end_of_line)
            end = end_of_line if cut < 0 else cut + 1
            spans.append((start, end))
            start = end + 1 if cut >= 0 else end_of_line
        offset = end_of_line + 1
    return spans


def _value(rng: random.Random) -> str:
    return f"{rng.uniform(30.0, 95.0):.1f}"


def _result(method: str, metric: str, dataset: str, value: str) -> str:
    return f"On {dataset}, {method} reaches {value} {metric}."


def _abstract_result(method: str, metric: str, dataset: str, value: str) -> str:
    return f"{method} achieves {value} {metric} on {dataset}."


def _paper(rng: random.Random, method: str, technique: str, domain: str) -> Paper:
    limit = rng.choice(LIMITS)
    title = f"{method}: {technique[0].upper()}{technique[1:]} for {domain}"
    sections = {
        "Abstract": [f"We study {domain} under a strict compute budget.",
                     f"We present {method}, a new system for {domain}."],
        "Introduction": [f"We introduce {technique}, a technique that "
                         f"{rng.choice(PURPOSES)}."],
        "Method": [f"{method} applies {technique} after every encoder block."],
        "Experiments": [],
        "Limitations": [f"A limitation of {technique} is that it {limit}."],
    }
    return Paper(method, technique, title, sections)


def _render(paper: Paper, rng: random.Random, domain: str) -> str:
    """The paper's text after padding its sections with fillers to a random length."""
    target = rng.randint(MIN_CHARS + 100, MAX_CHARS - 300)
    pools = {name: rng.sample(pool, len(pool)) for name, pool in FILLERS.items()}

    def text() -> str:
        body = [paper.title, ABSTRACT_LABEL + " ".join(paper.sections["Abstract"])]
        for name in SECTIONS:
            body += [f"## {name}", " ".join(paper.sections[name])]
        return "\n".join(body)

    order = ["Introduction", "Method", "Experiments", "Abstract", "Limitations"]
    turn = 0
    while len(text()) < target and any(pools[n] for n in order):
        name = order[turn % len(order)]
        turn += 1
        if pools[name]:
            sentence = pools[name].pop().format(M=paper.method, domain=domain)
            position = rng.randint(1, len(paper.sections[name])) if name == "Abstract" \
                else rng.randint(0, len(paper.sections[name]))
            paper.sections[name].insert(position, sentence)
    return text()


def make_example(rng: random.Random, index: int, split: str) -> dict[str, Any]:
    """One example (module docstring)."""
    n_papers = rng.randint(3, 5)
    domain = rng.choice(DOMAINS)
    methods = rng.sample([p + s for p in PREFIXES for s in SUFFIXES], n_papers)
    techniques = rng.sample(TECHNIQUES, n_papers)
    datasets = [f"{name}-{rng.randint(2, 64)}" for name in rng.sample(DATASETS, 3)]
    metrics = rng.sample(METRICS, 2)
    papers = [_paper(rng, m, t, domain) for m, t in zip(methods, techniques, strict=True)]
    kind = rng.choice(["lookup", "comparison", "attribution"])
    metric, dataset = metrics[0], datasets[0]
    gold_sentences: list[tuple[int, str]] = []
    if kind == "attribution":
        target = rng.randrange(n_papers)
        technique = papers[target].technique
        question = (f"Which paper introduces {technique}, and what limitation of it does "
                    "that paper state?")
        gold_sentences = [(target, papers[target].sections["Introduction"][0]),
                          (target, papers[target].sections["Limitations"][0])]
        answer = (f"P{target + 1} ({papers[target].method}) introduces {technique}; "
                  + papers[target].sections["Limitations"][0])
        for i, paper in enumerate(papers):
            if i != target and rng.random() < 0.6:
                paper.sections["Method"].append(
                    f"Unlike {technique}, {paper.method} needs no extra tuning.")
        reporting: list[int] = []
    else:
        reporting = sorted(rng.sample(range(n_papers), rng.randint(1, min(3, n_papers))))
        values: list[str] = []
        while len(values) < len(reporting):
            v = _value(rng)
            if v not in values:
                values.append(v)
        for i, v in zip(reporting, values, strict=True):
            paper = papers[i]
            sentence = _result(paper.method, metric, dataset, v)
            paper.sections["Experiments"].append(sentence)
            gold_sentences.append((i, sentence))
            if rng.random() < 0.5:
                sentence = _abstract_result(paper.method, metric, dataset, v)
                paper.sections["Abstract"].append(sentence)
                gold_sentences.append((i, sentence))
        if kind == "lookup":
            question = f"Which papers report {metric} on {dataset}, and with what values?"
            answer = "; ".join(f"P{i + 1} ({papers[i].method}): {v} {metric}"
                               for i, v in zip(reporting, values, strict=True))
        else:
            question = f"Which paper reports the highest {metric} on {dataset}?"
            best = max(range(len(values)), key=lambda j: float(values[j]))
            answer = (f"P{reporting[best] + 1} ({papers[reporting[best]].method}) with "
                      f"{values[best]} {metric}")
    for i, paper in enumerate(papers):  # other results and the distractors
        other = [(m, d) for m in metrics for d in datasets if (m, d) != (metric, dataset)]
        for m, d in rng.sample(other, rng.randint(1, 2)):
            paper.sections["Experiments"].append(_result(paper.method, m, d, _value(rng)))
        if rng.random() < 0.5:
            paper.sections["Experiments"].append(
                f"Prior work reported {_value(rng)} {metric} on {dataset} with a far larger "
                "model.")
        if i not in reporting and kind != "attribution" and rng.random() < 0.5:
            paper.sections["Introduction"].append(
                f"We do not evaluate on {dataset}, where {metric} is the usual measure.")
        rng.shuffle(paper.sections["Experiments"])
    texts = {f"P{i + 1}": _render(p, rng, domain) for i, p in enumerate(papers)}
    gold = []
    for i, sentence in gold_sentences:
        pid = f"P{i + 1}"
        start = texts[pid].index(sentence)
        gold.append({"paper_id": pid, "start": start, "end": start + len(sentence),
                     "text": sentence})
    gold.sort(key=lambda g: (int(str(g["paper_id"])[1:]), int(str(g["start"]))))
    return {"id": f"ex-{index:04d}", "split": split, "question": question,
            "papers": texts, "gold": gold, "answer": answer}


def generate(seed: int, num_train: int, num_eval: int) -> list[dict[str, Any]]:
    """``num_train`` train then ``num_eval`` eval examples from one seeded generator."""
    if num_train < 0 or num_eval < 0:
        raise ValueError(f"num_train={num_train} and num_eval={num_eval} must be >= 0")
    rng = random.Random(seed)
    return [make_example(rng, i, "train" if i < num_train else "eval")
            for i in range(num_train + num_eval)]


def dumps(examples: list[dict[str, Any]]) -> str:
    """The file's text: one JSON object per line."""
    return "".join(json.dumps(e, ensure_ascii=False) + "\n" for e in examples)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0, help="generator seed")
    parser.add_argument("--num_train", type=int, default=128, help="train examples")
    parser.add_argument("--num_eval", type=int, default=32, help="eval examples")
    parser.add_argument("--out", type=Path, default=OUT, help="output .jsonl file")
    parser.add_argument("--check", action="store_true",
                        help="exit 1 if --out differs from the generator's output")
    args = parser.parse_args(argv)
    text = dumps(generate(args.seed, args.num_train, args.num_eval))
    if args.check:
        same = args.out.exists() and args.out.read_text(encoding="utf-8") == text
        sys.stderr.write(f"{args.out}: {'up to date' if same else 'differs'}\n")
        return 0 if same else 1
    args.out.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
