"""``rlscope serve``: run the Tinker-compatible server (docs/tinker.md)."""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from typing import Any

from rich.console import Console
from rich.markup import escape

from rlscope.serve.config import ServeConfig


def run(cfg: ServeConfig) -> int:
    """Validate ``cfg``, build the app and serve it with uvicorn until interrupted."""
    console = Console(stderr=True)
    errors = cfg.validate()
    if errors:
        console.print("[red]error:[/red] invalid configuration:\n  - " + "\n  - ".join(errors))
        return 2
    try:
        import uvicorn

        from rlscope.serve.app import create_app
    except ImportError as e:
        console.print("[red]error:[/red] " + escape(f"rlscope serve needs the serve extra "
                                                    f"(pip install 'rlscope[serve]'): {e}"),
                      soft_wrap=True)
        return 2
    logging.basicConfig(level=cfg.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from rlscope.serve.state import UserError

    try:
        app = create_app(cfg)
    except UserError as e:
        console.print("[red]error:[/red] " + escape(str(e)), soft_wrap=True)
        return 2
    key_hint = ("TINKER_API_KEY=<the server's api_key>" if cfg.resolved_api_key()
                else "TINKER_API_KEY=tml-local (no key required on loopback)")
    console.print(f"rlscope serve: models {', '.join(cfg.models)}; runs and checkpoints under "
                  f"{cfg.root}; point the SDK at http://{cfg.host}:{cfg.port} with {key_hint}")
    if cfg.write_tokenizer:
        console.print(f"wrote the byte-level tokenizer to {cfg.write_tokenizer} (use it as "
                      "model_name / base_model)")
    hf_cache = app.state.context.engine.hf_cache
    if hf_cache:
        console.print(f"wrote the tokenizers of {', '.join(sorted(hf_cache))} to the Hugging Face "
                      f"cache {cfg.write_hf_cache}/hub (clients: HF_HOME={cfg.write_hf_cache} "
                      "HF_HUB_OFFLINE=1)", soft_wrap=True)
    begin_shutdown: Callable[[], None] = app.state.begin_shutdown

    class GracefulServer(uvicorn.Server):
        """uvicorn's server, whose SIGTERM/SIGINT first fails every queued request (so long
        polls answer at once) and arms a hard exit after ``--shutdown_timeout_s`` in case the
        running job will not stop."""

        armed = False

        def handle_exit(self, sig: int, frame: Any) -> None:
            if not self.armed:
                self.armed = True
                begin_shutdown()
                timer = threading.Timer(cfg.shutdown_timeout_s, _hard_exit,
                                        args=(cfg.shutdown_timeout_s,))
                timer.daemon = True
                timer.start()
            super().handle_exit(sig, frame)

    GracefulServer(uvicorn.Config(
        app, host=cfg.host, port=cfg.port, log_level=cfg.log_level,
        timeout_graceful_shutdown=max(1, int(cfg.shutdown_timeout_s / 2)))).run()
    return 0


def _hard_exit(deadline_s: float) -> None:
    logging.getLogger("rlscope.serve").error(
        "shutdown took longer than %.0f s (--shutdown_timeout_s); exiting now", deadline_s)
    os._exit(1)
