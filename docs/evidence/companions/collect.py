"""Summarise issue 21's companion sweeps (OPD and learnability) into this directory.

    rlscope sweep --builtin opd_compare --no_report           # sweeps/opd_compare
    rlscope sweep --builtin opd_topk_stability --no_report    # sweeps/opd_topk_stability
    rlscope sweep --builtin opd_topk_cold_start --no_report   # sweeps/opd_topk_cold_start
    rlscope sweep --builtin opd_topk_warmup --no_report       # sweeps/opd_topk_warmup
    rlscope sweep --builtin opd_soft_teacher --no_report      # sweeps/opd_soft_teacher
    rlscope sweep --builtin learnability --no_report          # sweeps/learnability
    python docs/evidence/companions/collect.py sweeps \
        --opd_variance_csv docs/evidence/companions/probes/opd_variance*/opd_variance.csv \
        --drift_csv docs/evidence/companions/probes/learnability_drift*/learnability_drift.csv

For every manifest folder found under the sweeps directory it writes, beside this file in
``<manifest>/``:

- ``summary.md``: the table that answers the experiment's question (COMPANIONS.md §1 and §5),
  every cell the seed mean ± sample sd (ddof = 1) with n the number of seeds;
- copies of the sweep's ``final.md``, ``crossings.md`` and ``switch.md`` (where present);
- ``curves_eval.csv``: the sweep's ``curves.csv`` trimmed to its evaluation rows (plus the
  sampled ``group/mixed_rate`` for learnability), written only when under 1 MB.

With ``--opd_variance_csv`` / ``--drift_csv`` it also writes ``seed_slopes.md`` beside each
probe CSV given: the probe's log–log slopes fitted per seed (mean ± sd over seeds), where the
probe's own ``summary.md`` fits seed means.

Only the run directories are read (``runs/<run>/{config.json,status.json,eval.jsonl,
metrics.jsonl}``); a run's configuration is its directory name without the ``_s<seed>``
suffix, and grid values are read back from that name (``topk-opd_top_k=4-opd_warmup_steps=50``).
Pure standard library.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import math
import shutil
import statistics
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).parent
CURVES_LIMIT_BYTES = 1_000_000
"""A trimmed curves file larger than this is not written (the folder stays small)."""
LEARNED_DROP = 0.1
"""A run "learned" when its final test error is at least this far below its step-0 error
(choice: the seeds' step-0 errors are ≈ 0.89 on token_reversal V 8 and the plateau of a
student that guesses a fixed token is ≈ 0.88)."""
SWITCH_KEYS = ("eval/top1_agreement", "eval/sampled_reward", "eval/opd_reverse_kl",
               "eval/student_topk_mass", "eval/teacher_topk_mass", "eval/test_error")
"""Switch-row quantities tested as predictors of final − switch test error."""


@dataclass(frozen=True)
class Run:
    """One run directory's logs."""

    name: str
    """Run directory name (configuration plus ``_s<seed>``)."""
    config: str
    """Configuration: the name without the seed suffix."""
    params: dict[str, str]
    """Grid values read from the configuration name (``key=value`` parts)."""
    evals: list[dict[str, float]]
    """eval.jsonl rows in order."""
    metrics: list[dict[str, float]]
    """metrics.jsonl rows in order (possibly thinned)."""


def jsonl(path: Path) -> list[dict[str, float]]:
    """Rows of a JSON-lines file; [] when absent; unreadable lines skipped."""
    if not path.exists():
        return []
    rows = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return rows


def parse_config(config: str) -> tuple[str, dict[str, str]]:
    """``topk-opd_top_k=4-opd_warmup_steps=50`` → (``topk``, {opd_top_k: 4, ...}).

    Values never contain ``-`` in these manifests (they are ints, floats and identifiers).
    """
    head, *parts = config.split("-")
    params = dict(part.split("=", 1) for part in parts if "=" in part)
    return head, params


def load_sweep(sweep: Path) -> dict[str, list[Run]]:
    """The sweep's runs grouped by configuration, in name order."""
    root = sweep / "runs" if (sweep / "runs").is_dir() else sweep
    grouped: dict[str, list[Run]] = defaultdict(list)
    for run_dir in sorted(root.iterdir()):
        if not (run_dir / "config.json").exists():
            continue
        config = run_dir.name.rsplit("_s", 1)[0]
        grouped[config].append(Run(
            name=run_dir.name, config=config, params=parse_config(config)[1],
            evals=jsonl(run_dir / "eval.jsonl"), metrics=jsonl(run_dir / "metrics.jsonl")))
    return dict(grouped)


def stats(values: list[float]) -> tuple[float, float, int]:
    """(mean, sample sd with ddof 1, n) over the finite values; sd nan when n < 2."""
    good = [v for v in values if isinstance(v, (int, float)) and math.isfinite(v)]
    if not good:
        return math.nan, math.nan, 0
    return statistics.fmean(good), statistics.stdev(good) if len(good) > 1 else math.nan, \
        len(good)


def fmt(values: list[float]) -> str:
    """``mean ± sd`` (4 and 2 significant digits); ``–`` when nothing is finite."""
    mean, sd, n = stats(values)
    return "–" if n == 0 else f"{mean:.4g} ± {sd:.2g}"


def eval_at(run: Run, key: str, where: str) -> float:
    """``key`` at the ``first`` evaluation, the ``last`` one or the ``switch`` row (the row
    tagged phase = switch; for a run without one, nan)."""
    rows = run.evals
    if where == "switch":
        rows = [r for r in rows if r.get("phase") == "switch"]
    if not rows:
        return math.nan
    row = rows[-1] if where == "last" else rows[0]
    return float(row.get(key, math.nan))


def eval_at_step(run: Run, key: str, step: int) -> float:
    """``key`` at the first evaluation row of ``step`` (nan if none)."""
    for row in run.evals:
        if row.get("step") == step:
            return float(row.get(key, math.nan))
    return math.nan


def column(runs: list[Run], key: str, where: str) -> list[float]:
    return [eval_at(r, key, where) for r in runs]


def ranks(values: list[float]) -> list[float]:
    """Ranks 1..n with ties averaged."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    out = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            out[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return out


def pearson(xs: list[float], ys: list[float]) -> float:
    """Pearson correlation over the pairs where both are finite; nan with < 3 pairs or a
    constant side."""
    pairs = [(x, y) for x, y in zip(xs, ys, strict=True) if math.isfinite(x) and math.isfinite(y)]
    if len(pairs) < 3:
        return math.nan
    mx = statistics.fmean(p[0] for p in pairs)
    my = statistics.fmean(p[1] for p in pairs)
    sxy = sum((x - mx) * (y - my) for x, y in pairs)
    sxx = sum((x - mx) ** 2 for x, _ in pairs)
    syy = sum((y - my) ** 2 for _, y in pairs)
    return sxy / math.sqrt(sxx * syy) if sxx > 0 and syy > 0 else math.nan


def spearman(xs: list[float], ys: list[float]) -> float:
    """Spearman correlation (Pearson of the tie-averaged ranks) over finite pairs."""
    pairs = [(x, y) for x, y in zip(xs, ys, strict=True) if math.isfinite(x) and math.isfinite(y)]
    if len(pairs) < 3:
        return math.nan
    return pearson(ranks([p[0] for p in pairs]), ranks([p[1] for p in pairs]))


def table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join("---" for _ in header) + " |"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


NOTE = ("Cells: seed mean ± sample sd (ddof = 1) over n seeds (n in the `seeds` column). "
        "Generated by `docs/evidence/companions/collect.py`.\n\n")


# ----------------------------------------------------------------------------- OPD


def opd_compare(grouped: dict[str, list[Run]]) -> str:
    """Final test error, exact reverse KL and sampled reward per preset."""
    keys = ("eval/test_error", "eval/opd_reverse_kl", "eval/sampled_reward", "eval/token_error")
    rows = [[name, str(len(runs))] + [fmt(column(runs, k, "first")) for k in keys[:1]]
            + [fmt(column(runs, k, "last")) for k in keys] for name, runs in grouped.items()]
    return ("# opd_compare: exact full-vocabulary reverse KL vs the sampled log-ratio\n\n" + NOTE
            + table(["configuration", "seeds", "initial test error", "final test error",
                     "final exact reverse KL", "final sampled reward", "final token error"],
                    rows))


def learned(run: Run) -> bool:
    """Final test error at least LEARNED_DROP below the step-0 error."""
    first, last = eval_at(run, "eval/test_error", "first"), eval_at(run, "eval/test_error", "last")
    return math.isfinite(first) and math.isfinite(last) and last <= first - LEARNED_DROP


def opd_topk_stability(grouped: dict[str, list[Run]]) -> str:
    """Initial vs final test error per configuration, and how many seeds learned."""
    rows = []
    for name, runs in grouped.items():
        delta = [eval_at(r, "eval/test_error", "last") - eval_at(r, "eval/test_error", "first")
                 for r in runs]
        best = [min(float(e.get("eval/test_error", math.nan)) for e in r.evals) for r in runs]
        rows.append([name, str(len(runs)), fmt(column(runs, "eval/test_error", "first")),
                     fmt(column(runs, "eval/test_error", "last")), fmt(delta), fmt(best),
                     f"{sum(learned(r) for r in runs)}/{len(runs)}",
                     fmt(column(runs, "eval/top1_agreement", "last")),
                     fmt(column(runs, "eval/student_entropy", "last"))])
    return ("# opd_topk_stability: does top-k learn from a random student?\n\n" + NOTE
            + f"`learned`: seeds whose final test error is ≥ {LEARNED_DROP} below their step-0 "
            "error.\n\n"
            + table(["configuration", "seeds", "initial test error", "final test error",
                     "final − initial", "best test error", "learned", "final top-1 agreement",
                     "final student entropy"], rows))


def opd_topk_cold_start(grouped: dict[str, list[Run]], switch_step: int = 100) -> str:
    """Test error at the switch step (the warm runs' switch row; the same step's evaluation for
    cold runs and the baseline) vs the final one."""
    rows = []
    for name, runs in grouped.items():
        at = [eval_at_step(r, "eval/test_error", switch_step) for r in runs]
        last = column(runs, "eval/test_error", "last")
        rows.append([name, str(len(runs)), fmt(column(runs, "eval/test_error", "first")),
                     fmt(at), fmt(last), fmt([b - a for a, b in zip(at, last, strict=True)]),
                     f"{sum(learned(r) for r in runs)}/{len(runs)}"])
    return (f"# opd_topk_cold_start: does a {switch_step}-step full-vocabulary warm-up survive "
            "the switch to top-k?\n\n" + NOTE
            + f"`step {switch_step}`: the evaluation at step {switch_step} (for the warm runs, the "
            "switch row, before the first top-k update). Negative final − switch = the top-k "
            "phase kept lowering the error.\n\n"
            + table(["configuration", "seeds", "initial test error",
                     f"test error at step {switch_step}", "final test error",
                     f"final − step {switch_step}", "learned"], rows))


def switch_quantities(run: Run, warmup: int) -> dict[str, float]:
    """The switch-row quantities and final − switch test error; W = 0 uses the step-0 row (the
    top-k loss is used from the first update on)."""
    row = next((r for r in run.evals if r.get("phase") == "switch"), None) if warmup > 0 \
        else (run.evals[0] if run.evals else None)
    if row is None:
        return {k: math.nan for k in (*SWITCH_KEYS, "final_minus_switch")}
    out = {k: float(row.get(k, math.nan)) for k in SWITCH_KEYS}
    out["final_minus_switch"] = eval_at(run, "eval/test_error", "last") - out["eval/test_error"]
    return out


def opd_topk_warmup(grouped: dict[str, list[Run]]) -> str:
    """Per (k, W): switch-row quantities and final − switch; then correlations of each switch
    quantity with final − switch over configuration means and over all runs."""
    configs = [(name, runs) for name, runs in grouped.items() if "opd_top_k" in runs[0].params]
    configs.sort(key=lambda c: (int(c[1][0].params["opd_top_k"]),
                                int(c[1][0].params.get("opd_warmup_steps", 0))))
    rows, per_config, per_run = [], [], []
    for _name, runs in configs:
        warmup = int(runs[0].params.get("opd_warmup_steps", 0))
        quantities = [switch_quantities(r, warmup) for r in runs]
        per_run += [(warmup, q) for q in quantities]
        top_k = int(runs[0].params["opd_top_k"])
        per_config.append((warmup, {k: stats([q[k] for q in quantities])[0]
                                    for k in quantities[0]} | {"top_k": float(top_k)}))
        rows.append([runs[0].params["opd_top_k"], str(warmup), str(len(runs))]
                    + [fmt([q[k] for q in quantities]) for k in (*SWITCH_KEYS,
                                                                 "final_minus_switch")]
                    + [fmt(column(runs, "eval/test_error", "last")),
                       f"{sum(learned(r) for r in runs)}/{len(runs)}"])
    baseline = grouped.get("opd_reverse_kl", [])
    corr_rows = []
    ks = sorted({int(q["top_k"]) for _, q in per_config})
    for key in SWITCH_KEYS:
        cells = [key]
        for subset in (per_config, [c for c in per_config if c[0] > 0], per_run,
                       [r for r in per_run if r[0] > 0],
                       *[[c for c in per_config if c[1]["top_k"] == k] for k in ks]):
            xs = [q[key] for _, q in subset]
            ys = [q["final_minus_switch"] for _, q in subset]
            n = sum(math.isfinite(x) and math.isfinite(y) for x, y in zip(xs, ys, strict=True))
            cells.append(f"{pearson(xs, ys):+.2f} / {spearman(xs, ys):+.2f} (n = {n})")
        corr_rows.append(cells)
    return ("# opd_topk_warmup: the warm-up needed per k; which switch quantity predicts "
            "final − switch?\n\n" + NOTE
            + "Switch row: the evaluation tagged phase = switch at step W (before the first "
            "top-k update); for W = 0 the step-0 evaluation (choice: the top-k loss acts from "
            "the first update).\n\n"
            + table(["k", "W", "seeds", *[f"switch {k.removeprefix('eval/')}"
                                          for k in SWITCH_KEYS],
                     "final − switch test error", "final test error", "learned"], rows)
            + (f"\nBaseline opd_reverse_kl: final test error "
               f"{fmt(column(baseline, 'eval/test_error', 'last'))} (n = {len(baseline)}).\n"
               if baseline else "")
            + "\n## Correlation of each switch quantity with final − switch test error\n\n"
            "Pearson / Spearman. Over configurations: the (k, W) seed means; over runs: every "
            "seed of every (k, W). For W > 0 the warm-up is the same exact-KL trajectory for "
            "both k (same seeds), so the top-1, sampled reward, reverse KL and test error at the "
            "switch are identical across k; only the support masses depend on k.\n\n"
            + table(["switch quantity", "all (k, W) means", "W > 0 means", "all runs",
                     "W > 0 runs", *[f"k = {k} means (all W)" for k in ks]], corr_rows))


def opd_soft_teacher(grouped: dict[str, list[Run]]) -> str:
    """Final test error per support × temperature × W, and the support ordering per
    (temperature, W) and averaged over W."""
    cells: dict[tuple[str, str, int], list[float]] = {}
    for runs in grouped.values():
        p = runs[0].params
        if "opd_support" not in p:
            continue
        cells[(p["opd_support"], p["teacher_temperature"], int(p["opd_warmup_steps"]))] = \
            column(runs, "eval/test_error", "last")
    supports = sorted({s for s, _, _ in cells})
    temps = sorted({t for _, t, _ in cells}, key=float, reverse=True)
    warmups = sorted({w for _, _, w in cells})
    header = ["support"] + [f"T {t}, W {w}" for t in temps for w in warmups]
    rows = [[s] + [fmt(cells.get((s, t, w), [])) for t in temps for w in warmups]
            for s in supports]
    base = [["opd_reverse_kl (baseline)"]
            + [fmt(column(grouped.get(f"opd_reverse_kl-teacher_temperature={t}", []),
                          "eval/test_error", "last")) for t in temps for _ in warmups]]
    order_rows, orders = [], {}
    for t in temps:
        for w in [*warmups, -1]:
            means = {s: (stats(cells.get((s, t, w), []))[0] if w >= 0 else statistics.fmean(
                stats(cells.get((s, t, ww), []))[0] for ww in warmups)) for s in supports}
            order = " < ".join(sorted(supports, key=lambda s: means[s]))
            orders[(t, w)] = order
            order_rows.append([t, "mean over W" if w < 0 else str(w), order,
                               ", ".join(f"{s} {means[s]:.3g}" for s in supports)])
    agree = [w for w in [*warmups, -1] if len({orders[(t, w)] for t in temps}) == 1]
    verdict = ("The ordering (lowest final error first) is the same at both temperatures for "
               + (", ".join("the mean over W" if w < 0 else f"W = {w}" for w in agree)
                  if agree else "no W") + ".\n")
    return ("# opd_soft_teacher: is there an ordering of supports that holds for broad and sharp "
            "teachers?\n\n" + NOTE + "Final test error, k = 4, soft teacher.\n\n"
            + table(header, rows + base)
            + "\n## Ordering of supports by mean final test error (lowest first)\n\n"
            + table(["temperature", "W", "ordering", "means"], order_rows) + "\n" + verdict)


# ---------------------------------------------------------------------------- learnability


def mixed_rate_gaps(run: Run) -> list[tuple[int, float, float, float]]:
    """Per evaluation step that also has a logged training step: (step, q, exact M(q, K),
    sampled group/mixed_rate). The evaluation at step s precedes update s, so both see the
    same policy."""
    sampled = {int(m["step"]): float(m["group/mixed_rate"]) for m in run.metrics
               if "group/mixed_rate" in m}
    out = []
    for row in run.evals:
        step = int(row["step"])
        if step in sampled and "eval/predicted_mixed_group_rate" in row:
            out.append((step, float(row.get("eval/success_probability", math.nan)),
                        float(row["eval/predicted_mixed_group_rate"]), sampled[step]))
    return out


def learnability(grouped: dict[str, list[Run]]) -> str:
    """Sampled mixed-group rate against exact M(q, K) per evaluation step, per normalisation."""
    parts, summary = [], []
    for name, runs in grouped.items():
        per_step: dict[int, list[tuple[float, float, float]]] = defaultdict(list)
        all_gaps = []
        for run in runs:
            for step, q, exact, sampled in mixed_rate_gaps(run):
                per_step[step].append((q, exact, sampled))
                all_gaps.append(sampled - exact)
        rows, mean_gaps = [], []
        for step in sorted(per_step):
            vals = per_step[step]
            gaps = [s - e for _, e, s in vals]
            mean_gaps.append(stats(gaps)[0])
            rows.append([str(step), str(len(vals)), fmt([v[0] for v in vals]),
                         fmt([v[1] for v in vals]), fmt([v[2] for v in vals]), fmt(gaps)])
        largest = max(mean_gaps, key=abs) if mean_gaps else math.nan
        m, sd, n = stats(all_gaps)
        sem = sd / math.sqrt(n) if n > 1 else math.nan
        summary.append([name, str(len(runs)), str(len(mean_gaps)), f"{largest:+.4f}",
                        f"{max((abs(g) for g in all_gaps), default=math.nan):.4f}",
                        f"{m:+.4f} ± {sem:.2g} (n = {n})"])
        parts.append(f"\n## {name}\n\n" + table(
            ["step", "seeds", "q (exact)", "M(q, K) exact", "sampled mixed rate",
             "sampled − exact"], rows))
    return ("# learnability: does the sampled mixed-group rate follow M(q, K) as q moves?\n\n"
            + NOTE + "Per evaluation step (every 10; the metrics file keeps every 5th step, so "
            "every evaluation step is paired): `eval/predicted_mixed_group_rate` (exact, mean "
            "over prompts of M(q_x, 8)) against the sampled `group/mixed_rate` of that step's "
            "64 groups. A binomial rate over 64 groups has sd ≈ √(M(1 − M)/64) ≈ 0.06 at "
            "M ≈ 0.5.\n\n"
            + table(["normalisation", "seeds", "steps", "largest |seed-mean gap| (signed)",
                     "largest |gap| of one run", "mean gap ± sem (all runs × steps)"], summary)
            + "".join(parts))


def loglog_slope(xs: list[float], ys: list[float]) -> float:
    """Least-squares slope of log y on log x (positive pairs only; nan with < 2)."""
    pairs = [(math.log(x), math.log(y)) for x, y in zip(xs, ys, strict=True) if x > 0 and y > 0]
    if len(pairs) < 2:
        return math.nan
    mx = statistics.fmean(p[0] for p in pairs)
    my = statistics.fmean(p[1] for p in pairs)
    sxx = sum((x - mx) ** 2 for x, _ in pairs)
    return sum((x - mx) * (y - my) for x, y in pairs) / sxx if sxx > 0 else math.nan


def opd_variance_slopes(rows: list[dict[str, str]]) -> str:
    """Per estimator: variance per H (mean ± sd over seeds) and the per-seed log–log slope on H
    (mean ± sd over seeds), from ``opd_variance.csv`` rows."""
    by: dict[tuple[str, str], dict[int, float]] = defaultdict(dict)
    for row in rows:
        by[(row["estimator"], row["seed"])][int(row["horizon"])] = float(row["variance"])
    estimators = list(dict.fromkeys(e for e, _ in by))
    horizons = sorted({h for d in by.values() for h in d})
    out = []
    for est in estimators:
        seeds = [d for (e, _), d in by.items() if e == est]
        slopes = [loglog_slope(sorted(d), [d[h] for h in sorted(d)]) for d in seeds]
        out.append([est, str(len(seeds))] + [fmt([d.get(h, math.nan) for d in seeds])
                                             for h in horizons] + [fmt(slopes)])
    return ("# opd_variance: per-seed log–log slopes\n\n" + NOTE
            + "Var over batches of uᵀg per horizon H, and the least-squares slope of log Var on "
              "log H fitted per seed.\n\n"
            + table(["estimator", "seeds", *[f"H = {h}" for h in horizons], "slope"], out))


def drift_seed_slopes(rows: list[dict[str, str]], max_q0: float = 0.1) -> str:
    """Per (mode, K, normalisation): the slope of log drift on log q₀ (q₀ ≤ max_q0) fitted per
    seed (mean ± sd over seeds), how many (seed, q₀) reached 2q₀ within the drift budget, and
    how many converted, from ``learnability_drift.csv`` rows."""
    by: dict[tuple[str, str, str], dict[str, list[dict[str, str]]]] = defaultdict(
        lambda: defaultdict(list))
    for row in rows:
        if float(row["q0"]) <= max_q0:
            by[(row["mode"], row["group_size"], row["normalisation"])][row["seed"]].append(row)
    out = []
    for (mode, k, norm), seeds in by.items():
        slopes = [loglog_slope([float(r["q0"]) for r in rs], [float(r["drift"]) for r in rs])
                  for rs in seeds.values()]
        flat = [r for rs in seeds.values() for r in rs]
        out.append([mode, k, norm, str(len(seeds)), fmt(slopes),
                    f"{sum(int(r['drift_reached']) for r in flat)}/{len(flat)}",
                    f"{sum(int(r['converted']) for r in flat)}/{len(flat)}"])
    return ("# learnability_drift: per-seed drift slopes\n\n" + NOTE
            + f"Slope of log drift on log q₀ over q₀ ≤ {max_q0}, fitted per seed. `reached 2q₀`"
              " and `converted`: (seed, q₀) pairs within the probe's step budgets.\n\n"
            + table(["mode", "K", "normalisation", "seeds", "drift slope", "reached 2q₀",
                     "converted"], out))


WRITERS = {"opd_compare": opd_compare, "opd_topk_stability": opd_topk_stability,
           "opd_topk_cold_start": opd_topk_cold_start, "opd_topk_warmup": opd_topk_warmup,
           "opd_soft_teacher": opd_soft_teacher, "learnability": learnability}
"""Manifest name → the summary writer answering its question."""


def trimmed_curves(curves: Path) -> str:
    """The curves.csv rows of kind eval (and group/mixed_rate), as CSV text."""
    out = io.StringIO()
    with curves.open(newline="", encoding="utf-8") as fh:
        reader = csv.DictReader(fh)
        writer = csv.DictWriter(out, fieldnames=reader.fieldnames or [], lineterminator="\n")
        writer.writeheader()
        for row in reader:
            if row["kind"] == "eval" or row["metric"] == "group/mixed_rate":
                writer.writerow(row)
    return out.getvalue()


def write(sweeps: Path, out: Path) -> list[Path]:
    """Write every known manifest's folder under ``out``; returns the summaries written."""
    written = []
    for manifest, writer in WRITERS.items():
        sweep = sweeps / manifest
        if not sweep.is_dir():
            continue
        folder = out / manifest
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "summary.md").write_text(writer(load_sweep(sweep)), encoding="utf-8")
        written.append(folder / "summary.md")
        for name in ("final.md", "crossings.md", "switch.md"):
            if (sweep / name).exists():
                shutil.copyfile(sweep / name, folder / name)
        if (sweep / "curves.csv").exists():
            text = trimmed_curves(sweep / "curves.csv")
            if len(text.encode("utf-8")) < CURVES_LIMIT_BYTES:
                (folder / "curves_eval.csv").write_text(text, encoding="utf-8")
    return written


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("sweeps", type=Path, help="directory holding one folder per manifest")
    parser.add_argument("--out", type=Path, default=HERE, help="output directory")
    parser.add_argument("--opd_variance_csv", type=Path, nargs="*", default=[],
                        help="opd_variance.csv files: writes <its folder>/seed_slopes.md")
    parser.add_argument("--drift_csv", type=Path, nargs="*", default=[],
                        help="learnability_drift.csv files: writes <its folder>/seed_slopes.md")
    args = parser.parse_args()
    for path in write(args.sweeps, args.out):
        print(path)
    for probe_csv in args.opd_variance_csv:
        with probe_csv.open(newline="", encoding="utf-8") as fh:
            text = opd_variance_slopes(list(csv.DictReader(fh)))
        (probe_csv.parent / "seed_slopes.md").write_text(text, encoding="utf-8")
        print(probe_csv.parent / "seed_slopes.md")
    for drift_csv in args.drift_csv:
        with drift_csv.open(newline="", encoding="utf-8") as fh:
            text = drift_seed_slopes(list(csv.DictReader(fh)))
        (drift_csv.parent / "seed_slopes.md").write_text(text, encoding="utf-8")
        print(drift_csv.parent / "seed_slopes.md")


if __name__ == "__main__":
    main()
