"""CUDA correctness: the same identities as on CPU, on a GPU. Skipped cleanly without one."""

from __future__ import annotations

import pytest
import torch

from rlscope.batch import PromptBatch
from rlscope.config import RunConfig, TrainConfig
from rlscope.policy.tiny import TinyConfig, TinyTransformer
from rlscope.sampling import SamplingConfig
from rlscope.tasks import TaskConfig
from rlscope.train import train

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


def test_cached_decode_equals_full_forward_on_cuda() -> None:
    torch.manual_seed(0)
    policy = TinyTransformer(TinyConfig(vocab_size=5, max_len=32)).cuda().eval()
    tokens_BT = torch.randint(0, 5, (4, 12), device="cuda")
    mask_BT = torch.ones_like(tokens_BT)
    mask_BT[0, :3] = 0
    mask_BT[2, :5] = 0
    with torch.no_grad():
        full_BTV, _ = policy(tokens_BT, mask_BT)
        cache = policy.init_cache(4, 12)
        logits = [policy.prefill(tokens_BT[:, :6], mask_BT[:, :6], cache)]
        logits += [policy.decode_step(tokens_BT[:, t], cache) for t in range(6, 11)]
    cached_BTV = torch.stack(logits, 1)
    torch.testing.assert_close(cached_BTV, full_BTV[:, 5:11], atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("sampling", [SamplingConfig(), SamplingConfig(temperature=0.7,
                                                                       top_p=0.9)])
def test_on_policy_first_pass_on_cuda(tmp_path, sampling: SamplingConfig) -> None:
    cfg = TrainConfig(method="grpo", sampling=sampling,
                      task_options=TaskConfig(seq_len=6, eval_batches=1, eval_batch_size=16),
                      run=RunConfig(num_steps=2, batch_size=32, inner_epochs=2, eval_every=0,
                                    device="cuda", progress=False, runs_dir=str(tmp_path)))
    first = train(cfg).metrics[0]
    assert abs(first["policy/ratio_mean_first"] - 1.0) < 1e-5
    assert first["policy/clipfrac_region_first"] == 0.0
    assert first["sampler/logp_diff_max"] < 1e-4


def test_prompt_batch_moves_to_cuda() -> None:
    batch = PromptBatch(tokens_BP=torch.zeros(2, 3, dtype=torch.long)).to("cuda")
    assert batch.tokens_BP.device.type == "cuda"
