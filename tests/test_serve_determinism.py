"""Model construction in `rlscope serve` never depends on torch's global RNG: builds running
concurrently on threads (samplers on the app's thread pool while the worker builds training
clients) give bit-identical weights, and a training client restored from a checkpoint (only
the trainable tensors are saved; the base is rebuilt from the seed) equals the one saved."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

pytest.importorskip("peft")
pytest.importorskip("tinker")

from rlscope.serve.config import ServeConfig
from rlscope.serve.engine import Engine
from rlscope.serve.state import LoraSettings, build_policy

CPU = torch.device("cpu")


def _state(policy: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in policy.state_dict().items()}


def _equal(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_builds_ignore_and_preserve_the_global_rng() -> None:
    cfg = ServeConfig(seed=3)
    torch.manual_seed(123)
    before = torch.get_rng_state()
    first = _state(build_policy(cfg, CPU, "tiny-llama", LoraSettings(rank=4))[0])
    assert torch.equal(torch.get_rng_state(), before)  # global state untouched
    torch.manual_seed(999)  # a different global state changes nothing
    assert _equal(first, _state(build_policy(cfg, CPU, "tiny-llama", LoraSettings(rank=4))[0]))
    other = _state(build_policy(ServeConfig(seed=4), CPU, "tiny-llama", None)[0])
    base = _state(build_policy(cfg, CPU, "tiny-llama", None)[0])
    assert not _equal(base, other)  # the seed does matter
    lora_b = [v for k, v in first.items() if "lora_B" in k]
    assert lora_b and all(float(v.abs().max()) == 0 for v in lora_b)  # PEFT's init: B = 0


def test_concurrent_builds_are_bit_identical() -> None:
    cfg = ServeConfig(seed=0)
    specs = [("tiny-llama", LoraSettings(rank=4)), ("tiny-llama", None),
             ("tiny-qwen2", LoraSettings(rank=2, seed=7)), ("tiny-qwen2", None)]
    reference = [_state(build_policy(cfg, CPU, s, lora)[0]) for s, lora in specs]
    stop = threading.Event()

    def churn() -> None:  # another thread drawing from (and reseeding) the global RNG
        while not stop.is_set():
            torch.manual_seed(int(torch.randint(0, 1000, ()).item()))
            torch.randn(64)

    noise = threading.Thread(target=churn)
    noise.start()
    try:
        with ThreadPoolExecutor(max_workers=4) as pool:
            built = list(pool.map(lambda i: _state(build_policy(cfg, CPU, *specs[i % 4])[0]),
                                  range(8)))
    finally:
        stop.set()
        noise.join()
    for i, state in enumerate(built):
        assert _equal(state, reference[i % 4]), i


def test_a_restored_client_is_bit_identical_while_samplers_build_concurrently(
        tmp_path: Path) -> None:
    cfg = ServeConfig(root=str(tmp_path / "root"), device="cpu",
                      models=("tiny=tiny-llama", "tinyq=tiny-qwen2"))
    engine = Engine(cfg)
    engine.create_model("s1", 0, "tiny", {"rank": 4}, None)
    saved = engine.models["s1:train:0"]
    gen = torch.Generator().manual_seed(5)
    with torch.no_grad():  # stand-in for training: move every trainable tensor
        for _, p in saved.trainable():
            p.add_(torch.randn(p.shape, generator=gen))
    path = engine.save_weights("s1:train:0", "ck")["path"]
    with ThreadPoolExecutor(max_workers=3) as pool:
        samplers = [pool.submit(engine.create_sampling_session, None, name)
                    for name in ("tiny", "tinyq")]
        others = pool.submit(engine.create_model, "s3", 0, "tinyq", {"rank": 2}, None)
        engine.load_weights(path, True, session_id="s2", model_seq_id=0)
        for f in [*samplers, others]:
            f.result()
    restored = engine.models["s2:train:0"]
    assert _equal(_state(saved.policy), _state(restored.policy))
    base = engine.base_policies["tiny-llama"][0]
    assert _equal(_state(base), _state(build_policy(cfg, CPU, "tiny-llama", None)[0]))
    engine.close()


class _Exploit:
    """Unpickling this runs ``touch`` (what a crafted checkpoint would do)."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[str, ...]]:
        import os

        return (os.system, (f"touch {self.marker}",))


def test_a_crafted_pickle_checkpoint_is_refused_and_runs_nothing(tmp_path: Path) -> None:
    from rlscope.serve.state import UserError

    cfg = ServeConfig(root=str(tmp_path / "root"), device="cpu")
    engine = Engine(cfg)
    engine.create_model("s1", 0, "tiny", {"rank": 4}, None)
    path = engine.save_weights("s1:train:0", "ck")["path"]
    from rlscope.serve.checkpoints import checkpoint_dir

    ckpt = checkpoint_dir(engine.root, path)
    marker = tmp_path / "pwned"
    for victim in ("trainable.pt", "optimizer.pt"):
        original = (ckpt / victim).read_bytes()
        torch.save({"x": _Exploit(marker)}, ckpt / victim)
        with pytest.raises(UserError, match="refused") as err:
            engine.load_weights(path, True, session_id=f"s-{victim}", model_seq_id=0)
        assert str(tmp_path) not in str(err.value)
        assert not marker.exists()
        assert f"s-{victim}:train:0" not in engine.models  # vetted before the client exists
        (ckpt / victim).write_bytes(original)
    engine.load_weights(path, True, session_id="s-ok", model_seq_id=0)  # intact: loads
    engine.close()
