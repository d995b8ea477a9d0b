"""``rlscope probe NAME`` and the learnability probes (COMPANIONS.md §5): the registry and its
writer, the fitted slopes on exact power laws, the closed-form policy gradient against
autograd, the puzzle generator and its exact law against sampling, the instruments by hand,
the rejections, and small CLI runs that write the CSV and the summary."""

from __future__ import annotations

import csv
import math
from pathlib import Path

import pytest
import torch

from rlscope.cli import main
from rlscope.probes import PROBES
from rlscope.probes.base import ProbeResult, geometric_mean, loglog_slope, write_result
from rlscope.probes.learnability_drift import (
    DriftConfig,
    drift_errors,
    group_advantages,
    run_drift,
    score_loss_grad,
)
from rlscope.probes.puzzle_topology import (
    HORIZON_WEIGHTS,
    PuzzleConfig,
    exact_outcomes,
    puzzle_errors,
    puzzle_paths,
    rollout_outcomes,
    teacher_forced_instruments,
)


def test_registry_is_a_plain_dict_of_the_learnability_probes() -> None:
    assert type(PROBES) is dict
    assert {"learnability_drift", "puzzle_topology"} <= set(PROBES)
    assert PROBES["learnability_drift"].config is DriftConfig
    assert PROBES["puzzle_topology"].config is PuzzleConfig


def test_loglog_slope_and_geometric_mean() -> None:
    x = [0.1, 0.05, 0.025, 0.0125]
    assert loglog_slope(x, [3 * v ** 2 for v in x]) == pytest.approx(2.0)
    assert loglog_slope(x, [7 / v for v in x]) == pytest.approx(-1.0)
    assert math.isnan(loglog_slope([1.0], [2.0]))
    assert geometric_mean([2.0, 8.0]) == pytest.approx(4.0)


def test_write_result_writes_the_csv_and_summary(tmp_path: Path) -> None:
    result = ProbeResult(rows=[{"seed": 0, "a": 1.5}, {"seed": 1, "a": 2.5, "b": "x"}],
                         summary="# s\n")
    csv_path, summary_path = write_result(result, "demo", tmp_path / "out")
    assert csv_path == tmp_path / "out" / "demo.csv"
    with csv_path.open() as f:
        rows = list(csv.DictReader(f))
    assert rows == [{"seed": "0", "a": "1.5", "b": ""}, {"seed": "1", "a": "2.5", "b": "x"}]
    assert summary_path.read_text() == "# s\n"


# ------------------------------------------------------------------ learnability_drift


def test_group_advantages_by_hand() -> None:
    r = torch.tensor([[1.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]])
    # mean 0.25: centred (0.75, −0.25, −0.25, −0.25); std √(0.25·0.75) = 0.4330
    assert group_advantages(r, "mean")[0].tolist() == pytest.approx([0.75, -0.25, -0.25, -0.25])
    std = math.sqrt(0.1875)
    assert group_advantages(r, "std")[0].tolist() == pytest.approx(
        [0.75 / std, -0.25 / std, -0.25 / std, -0.25 / std])
    assert group_advantages(r, "std")[1].tolist() == [0.0, 0.0, 0.0, 0.0]  # flat group


def test_closed_form_gradient_equals_autograd() -> None:
    torch.manual_seed(0)
    logits = torch.randn(2, 3, 4, 5, requires_grad=True)   # S, N, D, b
    actions = torch.randint(0, 5, (2, 3, 6, 4))             # S, N, K, D
    w = torch.randn(2, 3, 6, 4)
    logp = logits.log_softmax(-1)                           # [S, N, D, b]
    picked = logp[:, :, None].expand(-1, -1, 6, -1, -1).gather(
        -1, actions[..., None])[..., 0]                     # [S, N, K, D]
    (grad,) = torch.autograd.grad(-(w * picked).sum(), logits)
    closed = score_loss_grad(logits.detach().softmax(-1), actions, w)
    assert torch.allclose(closed, grad, atol=1e-6)


def test_drift_rejections() -> None:
    errors = drift_errors(DriftConfig(group_sizes="1,8", lr=0.0, modes="both",
                                      conversion_max_steps=10))
    text = "\n".join(errors)
    assert "--group_sizes='1,8': every K must be >= 2" in text
    assert "--lr=0.0 must be > 0" in text
    assert "--modes='both': choose from homogeneous, mixture" in text
    assert "--conversion_max_steps=10 must be >= --drift_max_steps=2000" in text
    with pytest.raises(ValueError, match="comma-separated integers"):
        run_drift(DriftConfig(group_sizes="four"))


def test_small_drift_run_moves_cold_starts_up(tmp_path: Path) -> None:
    cfg = DriftConfig(group_sizes="4", num_prompts=16, num_seeds=1, q0_halvings=4,
                      drift_max_steps=60, conversion_max_steps=60, modes="homogeneous,mixture",
                      out_dir=str(tmp_path))
    result = run_drift(cfg)
    assert len(result.rows) == 2 * 1 * 2 * 1 * 4  # modes × K × normalisations × seeds × q₀
    cold = [r for r in result.rows if float(r["q0"]) <= 0.25]
    # group policy gradient only raises q from a homogeneous start (drift > 0 on average)
    assert sum(float(r["drift"]) for r in cold) > 0
    assert all(1 <= int(r["drift_steps"]) <= 60 for r in result.rows)
    assert "std/mean drift ratio" in result.summary


# ------------------------------------------------------------------ puzzle_topology


def test_puzzle_generator_structure() -> None:
    paths = puzzle_paths(20_000, 0.0, torch.Generator().manual_seed(0))
    counts = torch.bincount(paths.horizon_P, minlength=7)[1:].float()
    share = counts / counts.sum()
    expected = torch.tensor(HORIZON_WEIGHTS) / sum(HORIZON_WEIGHTS)
    assert torch.allclose(share, expected, atol=0.01)
    inside = paths.moves_PH[paths.state_mask_PH]
    assert int(inside.min()) >= 2 and int(inside.max()) <= 40   # no forced states at rate 0
    assert torch.equal(paths.decisions_P, paths.horizon_P)
    forced = puzzle_paths(20_000, 0.5, torch.Generator().manual_seed(0))
    assert float((forced.moves_PH == 1).sum() / forced.state_mask_PH.sum()) == pytest.approx(
        0.5, abs=0.02)


def test_exact_law_by_hand_and_against_sampling() -> None:
    paths = puzzle_paths(4000, 0.2, torch.Generator().manual_seed(1))
    exact = exact_outcomes(paths, 0.6, 8)
    # a puzzle of horizon 2 with both states unforced: q = 0.36, strict actions 1 + 0.6
    idx = int(((paths.horizon_P == 2) & (paths.decisions_P == 2)).nonzero()[0])
    assert float(exact["reward_P"][idx]) == pytest.approx(0.36)
    assert float(exact["strict_actions_P"][idx]) == pytest.approx(1.6)
    assert float(exact["mixed_P"][idx]) == pytest.approx(1 - 0.36 ** 8 - 0.64 ** 8)
    sampled = rollout_outcomes(paths, 0.6, 8, torch.Generator().manual_seed(2))
    assert float(sampled["reward_PK"].mean()) == pytest.approx(float(exact["reward_P"].mean()),
                                                               abs=0.01)
    assert float(sampled["strict_actions_PK"].mean()) == pytest.approx(
        float(exact["strict_actions_P"].mean()), abs=0.02)
    # paired protocols: strict actions + replay's post-error actions = H on every rollout
    total = sampled["strict_actions_PK"] + sampled["post_error_PK"]
    assert torch.equal(total, paths.horizon_P[:, None].float().expand_as(total))


def test_teacher_forced_instruments_by_hand() -> None:
    # one puzzle: solution tokens log-probs (log .5, log 1 (a reply), log .25); decisions at 0, 2
    logp = torch.log(torch.tensor([[0.5, 1.0, 0.25]]))
    out = teacher_forced_instruments(logp, torch.tensor([[True, False, True]]),
                                     torch.tensor([[True, True, True]]), group_size=2)
    assert out["teacher_forced_q"] == pytest.approx(0.125)
    assert out["contrast_mass"] == pytest.approx(1 - 0.125 ** 2 - 0.875 ** 2)
    assert out["decision_ce"] == pytest.approx((math.log(2) + math.log(4)) / 2)
    assert out["total_ce"] == pytest.approx((math.log(2) + math.log(4)) / 3)


def test_puzzle_rejections() -> None:
    text = "\n".join(puzzle_errors(PuzzleConfig(forced_rate=1.0, correct_probability=0.0,
                                                group_size=1, protocol="lenient")))
    for part in ("--forced_rate=1.0 must be in [0, 1)", "--correct_probability=0.0",
                 "--group_size=1 must be >= 2", "--protocol='lenient'"):
        assert part in text


# ------------------------------------------------------------------ the command


def test_probe_command_writes_csv_and_summary(tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "pz"
    assert main(["probe", "puzzle_topology", "--num_puzzles", "500", "--num_seeds", "2",
                 "--protocol", "strict", "--out_dir", str(out)]) == 0
    with (out / "puzzle_topology.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert {r["seed"] for r in rows} == {"0", "1"}
    assert "replay_actions" not in rows[0] and "strict_actions_sampled" in rows[0]
    assert (out / "summary.md").read_text().startswith("# puzzle_topology")
    assert "rows:" in capsys.readouterr().out


def test_probe_command_usage_and_errors(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["probe", "--help"])
    assert info.value.code == 0
    assert "learnability_drift" in capsys.readouterr().out
    assert main(["probe", "nope"]) == 2
    assert "unknown probe 'nope'" in capsys.readouterr().err
    assert main(["probe", "puzzle_topology", "--group_size", "1"]) == 2
    assert "--group_size=1 must be >= 2" in capsys.readouterr().err
