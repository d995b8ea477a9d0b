"""``rlscope serve``: run the Tinker-compatible server (docs/tinker.md)."""

from __future__ import annotations

import logging

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
    if not cfg.is_loopback:
        console.print(
            f"[bold red]WARNING:[/bold red] binding to {cfg.host}, which is not a loopback "
            "address. The Tinker protocol has no real authentication (any key starting with "
            "'tml-' is accepted), so anyone who can reach this port can train, sample and "
            "read or overwrite checkpoints under --root. Bind to 127.0.0.1 unless you mean it.")
    app = create_app(cfg)
    console.print(f"rlscope serve: models {', '.join(cfg.models)}; runs and checkpoints under "
                  f"{cfg.root}; point the SDK at http://{cfg.host}:{cfg.port} with "
                  "TINKER_API_KEY=tml-local")
    if cfg.write_tokenizer:
        console.print(f"wrote the byte-level tokenizer to {cfg.write_tokenizer} (use it as "
                      "model_name / base_model)")
    uvicorn.run(app, host=cfg.host, port=cfg.port, log_level=cfg.log_level)
    return 0
