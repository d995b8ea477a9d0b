"""Hugging Face files the server writes: exported weights and an offline hub cache.

- `save_external` (``save_weights_external``): a training client's current weights as a
  Hugging Face model directory (``config.json``, ``model.safetensors``, the tokenizer), LoRA
  merged into the base weights, under ``ROOT/<run>/checkpoints/external_weights/<name>/``;
  ``transformers.AutoModelForCausalLM.from_pretrained`` loads it, and the server accepts the
  directory as a ``base_model``.
- `write_hf_cache` (``--write_hf_cache DIR``): for every alias of the ``--models`` table whose
  name is a hub repository id (``org/name``), the served model's tokenizer files and
  ``config.json`` in the hub-cache layout huggingface_hub reads,
  ``DIR/hub/models--{org}--{name}/{blobs/<sha1>, snapshots/<rev>/<file> → ../../blobs/<sha1>,
  refs/main}``. With ``HF_HOME=DIR`` (or ``HF_HUB_CACHE=DIR/hub``) and ``HF_HUB_OFFLINE=1`` an
  unmodified client's ``AutoTokenizer.from_pretrained("org/name")`` finds them, so recipes that
  look tokenizers up by hub name run with no network.
"""

from __future__ import annotations

import copy
import hashlib
import os
import shutil
import tempfile
from pathlib import Path

from rlscope.serve import checkpoints
from rlscope.serve.config import ServeConfig, hub_cache_ids
from rlscope.serve.state import TINY_SPECS, TrainingModel, UserError
from rlscope.serve.tokenizer_dir import TINY_TOKENS, write_tokenizer_dir

EXTERNAL_KIND = "external_weights"

def write_model_files(cfg: ServeConfig, spec: str, out: Path) -> Path:
    """The tokenizer files and ``config.json`` of model ``spec`` in ``out`` (no weights).

    A tiny spec gets its byte-level tokenizer and the config of the model the server builds
    (same vocabulary, width, layers, positions); a Hugging Face directory gets its tokenizer
    (re-saved by ``AutoTokenizer``) and its ``config.json``."""
    from transformers import AutoConfig, AutoTokenizer

    out.mkdir(parents=True, exist_ok=True)
    if spec in TINY_SPECS:
        from rlscope.policy.hf import tiny_hf_model

        write_tokenizer_dir(out, spec, marker=False)
        model = tiny_hf_model(TINY_SPECS[spec], TINY_TOKENS[spec].vocab_size, seed=0,
                              hidden_size=cfg.tiny_d_model, num_layers=cfg.tiny_layers,
                              num_heads=cfg.tiny_heads, max_len=cfg.tiny_max_len)
        model.config.save_pretrained(str(out))  # type: ignore[union-attr, operator]
        return out
    if not Path(spec, "config.json").is_file():
        raise UserError(f"model spec {spec!r} is neither a tiny model "
                        f"({', '.join(TINY_SPECS)}) nor a Hugging Face model directory")
    AutoTokenizer.from_pretrained(spec, local_files_only=True).save_pretrained(str(out))
    AutoConfig.from_pretrained(spec, local_files_only=True).save_pretrained(str(out))
    return out


def save_external(cfg: ServeConfig, model: TrainingModel, name: str,
                  encryption_recipients: object = None) -> dict[str, object]:
    """``save_weights_external``: ``model``'s weights (LoRA merged in) as a Hugging Face
    directory; answers ``{path: tinker://<run>/external_weights/<name>, size_bytes}``."""
    if encryption_recipients:
        raise UserError("age_encryption_recipients is not supported by rlscope serve: the "
                        "export is written unencrypted to the server's own disk; omit it")
    name = checkpoints.checkpoint_name(name)
    out = model.run_dir / "checkpoints" / EXTERNAL_KIND / name
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    hf_model = model.policy.unwrap()
    if model.policy.has_adapters:
        # merge into a copy: the live adapter keeps training
        merged = copy.deepcopy(hf_model).merge_and_unload()  # type: ignore[operator]
    else:
        merged = hf_model
    merged.save_pretrained(str(out), safe_serialization=True)  # type: ignore[operator]
    write_model_files(cfg, model.spec, out / ".tokenizer")
    for f in (out / ".tokenizer").iterdir():
        if f.name != "config.json":  # the weights' own config.json stays
            shutil.move(str(f), out / f.name)
    shutil.rmtree(out / ".tokenizer")
    size = sum(f.stat().st_size for f in out.rglob("*") if f.is_file())
    return {"type": "save_weights_external",
            "path": f"tinker://{model.model_id}/{EXTERNAL_KIND}/{name}", "size_bytes": size}


def _git_blob_sha1(data: bytes) -> str:
    """The id git (and so the hub cache) gives a regular file: SHA-1 of ``blob <n>\\0`` + data."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def write_cache_repo(hub_cache: Path, repo_id: str, files: Path) -> Path:
    """The files of directory ``files`` as a cached snapshot of model repo ``repo_id``:
    content-addressed blobs, a snapshot of relative symlinks, ``refs/main`` naming it.

    The revision is a hash of the contents, so the same files give the same snapshot again;
    returns the snapshot directory."""
    repo = hub_cache / ("models--" + repo_id.replace("/", "--"))
    blobs = repo / "blobs"
    blobs.mkdir(parents=True, exist_ok=True)
    entries = sorted((f.name, f.read_bytes()) for f in files.iterdir()
                     if f.is_file() and not f.name.startswith("."))
    shas = {name: _git_blob_sha1(data) for name, data in entries}
    revision = hashlib.sha1("".join(f"{n}:{s}\n" for n, s in shas.items()).encode()).hexdigest()
    snapshot = repo / "snapshots" / revision
    snapshot.mkdir(parents=True, exist_ok=True)
    for name, data in entries:
        blob = blobs / shas[name]
        if not blob.exists():
            blob.write_bytes(data)
        link = snapshot / name
        if link.is_symlink() or link.exists():
            link.unlink()
        os.symlink(os.path.relpath(blob, snapshot), link)
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / "main").write_text(revision)
    return snapshot


def write_hf_cache(cfg: ServeConfig, aliases: dict[str, str], root: str | Path
                   ) -> dict[str, Path]:
    """``--write_hf_cache``: a hub-cache entry under ``root/hub`` for every alias whose name
    is a hub id; returns repository id → snapshot directory. Aliases that are not hub ids
    (e.g. ``tiny``) get none. Two aliases remapped to the same id (`TOKENIZER_REMAPS`) must
    serve the same spec."""
    hub_cache = Path(root) / "hub"
    written: dict[str, Path] = {}
    spec_of: dict[str, str] = {}
    for alias, spec in aliases.items():
        for repo_id in hub_cache_ids(alias):
            if repo_id in spec_of and spec_of[repo_id] != spec:
                raise UserError(f"--write_hf_cache: {repo_id} would hold the tokenizer of both "
                                f"{spec_of[repo_id]} and {spec}; alias those names to one model")
            spec_of[repo_id] = spec
    with tempfile.TemporaryDirectory() as tmp:
        made: dict[str, Path] = {}
        for repo_id, spec in spec_of.items():
            if spec not in made:
                made[spec] = write_model_files(cfg, spec, Path(tmp) / str(len(made)))
            written[repo_id] = write_cache_repo(hub_cache, repo_id, made[spec])
    return written
