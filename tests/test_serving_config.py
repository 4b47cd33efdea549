"""Choosing engines and fitting one GPU: the presets, the stack's engine, the memory budget, `rollout models
pull`.

Everything here runs on CPU: what a GPU machine would start is checked as the command line the stack builds
and as the budget's arithmetic; the refusals (vLLM without a GPU, a model not pulled, no network) run for
real.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from rollout.cli.common import load_settings
from rollout.config import EngineKind, Settings
from rollout.config.catalog import CATALOG, settings_budget
from rollout.config.overrides import hydra_quote
from rollout.net import free_port
from rollout.stack.engine import engine_problem
from rollout.stack.roles import ENGINE, TRAINER

ROLLOUT = shutil.which("rollout") or "rollout"


def rollout(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [ROLLOUT, *args], capture_output=True, text=True, timeout=120, env={**os.environ, **(env or {})}
    )


def told(settings: Settings, role: str) -> Settings:
    """The settings the stack's process of `role` loads from the command line the stack starts it with."""
    from rollout.stack.embedded import Stack

    process = Stack(settings).process(role)
    assert process is not None and process.command[1:3] == ("-m", "rollout.cli")
    return load_settings([argument for argument in process.command if "=" in argument])


def test_the_minecraft_one_gpu_preset_composes_and_fits_sixteen_gigabytes() -> None:
    settings = load_settings(["preset=minecraft-one-gpu"])
    assert (
        settings.engine_kind == EngineKind.vllm
        and settings.services.engine.vllm_quantization == "bitsandbytes"
    )
    assert (settings.trainer.quantization, settings.trainer.lora_rank) == ("nf4", 32)
    assert settings.trainer.model == settings.services.gateway.model == "qwen3.5-9b"
    assert settings.gpu_lease == "0", "gpu.mode=shared: the trainer holds the GPU's lease while it steps"
    assert told(settings, TRAINER.name).gpu_lease == "0", "the trainer holds the GPU's lease while it steps"
    engine = told(settings, ENGINE.name)
    assert engine.engine_kind == EngineKind.vllm and engine.gpu_lease == "0"
    assert engine.services.engine.vllm_quantization == "bitsandbytes"
    assert engine.services.engine.vllm_max_num_seqs == 8, "the engine process schedules no more"
    extra = load_settings(
        ["preset=minecraft-one-gpu", 'services.engine.vllm_extra_args=["--enforce-eager","-O0"]']
    )
    carried = told(extra, ENGINE.name)
    assert carried.services.engine == extra.services.engine, "the engine process reads services.engine.* back"
    assert carried.services.gateway == extra.services.gateway
    assert (carried.engine_kind, carried.gpu_lease) == (extra.engine_kind, extra.gpu_lease)
    # Only the trainer's settings the engine reads: a run of more steps leaves the engine's process alone.
    more_steps = load_settings(["preset=minecraft-one-gpu", "trainer.steps=99", "trainer.learning_rate=0.5"])
    from rollout.stack.embedded import Stack

    engine_process, again = Stack(settings).process(ENGINE.name), Stack(more_steps).process(ENGINE.name)
    assert engine_process is not None and again is not None and again.command == engine_process.command
    tinker = load_settings(
        ["preset=minecraft-one-gpu", "trainer.provider=tinker", "trainer.tinker_url=http://t"]
    )
    assert told(tinker, ENGINE.name).trainer.tinker_url == "http://t"
    assert told(extra, TRAINER.name).trainer == extra.trainer, "the trainer trains what was asked"

    budget = settings_budget(settings)
    assert budget.fits, budget.table()
    assert budget.peak_gib <= 16 - budget.headroom_gib
    assert budget.engine_needs_gib <= (budget.engine_share_gib or 0), (
        "vLLM's share holds its weights and cache"
    )
    assert 6 < sum(i.gib for i in budget.training if "weights" in i.name) < 9, (
        "a 4-bit 9B base with bf16 embeddings"
    )

    # vLLM's start-up profiling samples --max-num-seqs sequences at once over a 248k vocabulary: the preset
    # bounds it to gpu.sequences; at vLLM's default of 256 (on a 16 GiB GPU) it takes 1.5 GiB more of the
    # share, and on a GPU of 70 GiB or more vLLM's default is 1024.
    (profiling,) = [item for item in budget.serving if "profiling peak" in item.name]
    assert "(8 sequences)" in profiling.name
    unbounded = settings_budget(
        load_settings(["preset=minecraft-one-gpu", "services.engine.vllm_max_num_seqs=null"])
    )
    assert 1.4 < unbounded.engine_needs_gib - budget.engine_needs_gib < 1.6, unbounded.table()
    big = settings_budget(
        load_settings(
            ["preset=minecraft-one-gpu", "services.engine.vllm_max_num_seqs=null", "gpu.memory_gib=141"]
        )
    )
    assert any("(1024 sequences)" in item.name for item in big.serving), big.table()
    # vLLM sizes every LoRA slot at its --max-lora-rank, whatever rank the trainer trains at.
    (slots,) = [item for item in budget.serving if "LoRA slots" in item.name]
    wider = settings_budget(
        load_settings(["preset=minecraft-one-gpu", "services.engine.vllm_max_lora_rank=128"])
    )
    (wider_slots,) = [item for item in wider.serving if "LoRA slots" in item.name]
    assert "rank 128" in wider_slots.name and wider_slots.gib == pytest.approx(slots.gib * 4)
    # The budget bites: logits at every position no longer fit, nor does three times the context, nor a bf16
    # base.
    assert not settings_budget(load_settings(["preset=minecraft-one-gpu", "gpu.sampled_tokens=null"])).fits
    longer = load_settings(["preset=minecraft-one-gpu", "services.gateway.max_context=12288"])
    assert not settings_budget(longer).fits
    assert not settings_budget(load_settings(["preset=minecraft-one-gpu", "trainer.quantization=null"])).fits


def test_rollout_config_budget_prints_the_phases_and_fails_a_configuration_that_does_not_fit() -> None:
    fits = rollout("config", "budget", "--preset", "minecraft-one-gpu", "--json")
    assert fits.returncode == 0, fits.stderr
    report = json.loads(fits.stdout)
    assert (
        report["fits"]
        and report["device_gib"] == 16
        and "trainer weights (nf4 blocks, bf16 embeddings)" in report["training"]
    )
    too_big = rollout("config", "budget", "--preset", "minecraft-one-gpu", "trainer.micro_batch_tokens=12288")
    assert too_big.returncode == 1 and "does NOT fit" in too_big.stdout
    assert "lower trainer.micro_batch_tokens" in too_big.stderr and "Traceback" not in too_big.stderr
    unknown = rollout("config", "budget")
    assert unknown.returncode == 2 and "budgets know the catalog's models" in unknown.stderr


def test_the_stack_starts_the_engine_its_settings_choose() -> None:
    local = load_settings([])
    assert local.engine_kind == EngineKind.local and local.gpu_lease is None
    assert told(local, ENGINE.name).engine_kind == EngineKind.local
    tinker = load_settings(
        [
            "trainer.provider=tinker",
            "trainer.tinker_base_model=Qwen/Qwen3-8B",
            "data_dir=" + hydra_quote("/tmp/it's here, #1"),
        ]
    )
    assert tinker.engine_kind == EngineKind.tinker, "trainer.provider=tinker brings a Tinker engine"
    engine = told(tinker, ENGINE.name)
    assert engine.engine_kind == EngineKind.tinker
    assert engine.trainer.tinker_base_model == "Qwen/Qwen3-8B"
    assert engine.data_path == tinker.data_path, "a path Hydra would misread is quoted"
    pinned = load_settings(["trainer.provider=tinker", "services.engine.kind=local"])
    assert pinned.engine_kind == EngineKind.local, "an explicit kind wins over auto"
    vllm = load_settings(["services.engine.kind=vllm"])
    problem = engine_problem(vllm)
    if shutil.which("vllm") is None:
        assert problem is not None and "uv sync --extra vllm" in problem


def test_a_4_bit_vllm_base_needs_the_bnb_plugin_in_the_python_that_runs_vllm(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """vLLM 0.33 knows bitsandbytes only through vllm-bnb-plugin: without it `vllm serve --quantization
    bitsandbytes` exits with "Unknown quantization method" on the GPU machine. A stand-in `vllm` whose Python
    (`-S`: no site-packages) has no such plugin, then one that has it (on its PYTHONPATH)."""
    folder = tmp_path / "bin"
    folder.mkdir()
    (folder / "vllm").write_text(f"#!{sys.executable} -S\n")
    (folder / "vllm").chmod(0o755)
    monkeypatch.setenv("PATH", f"{folder}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.delenv("PYTHONPATH", raising=False)
    quantized = load_settings(["services.engine.kind=vllm", "services.engine.vllm_quantization=bitsandbytes"])
    problem = engine_problem(quantized) or ""
    assert "needs vllm-bnb-plugin where vLLM runs" in problem and str(folder / "vllm") in problem
    assert "vllm-bnb-plugin" not in (engine_problem(load_settings(["services.engine.kind=vllm"])) or "")
    plugin = tmp_path / "site" / "vllm_bnb_plugin"
    plugin.mkdir(parents=True)
    (plugin / "__init__.py").write_text("")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "site"))
    assert "vllm-bnb-plugin" not in (engine_problem(quantized) or "")


def test_rollout_up_refuses_an_engine_that_cannot_run_here_before_starting_anything(tmp_path: Path) -> None:
    # Tinker without a key cannot run anywhere: that refusal is checked on every machine.
    data = tmp_path / "data"
    env = {key: value for key, value in os.environ.items() if key != "TINKER_API_KEY"}
    refused = subprocess.run(
        [ROLLOUT, "up", f"data_dir={data}", "services.engine.kind=tinker"],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert refused.returncode == 1, refused.stdout + refused.stderr
    assert "needs a Tinker API key" in refused.stderr and "Traceback" not in refused.stderr
    assert not data.exists(), "nothing was started or created"
    # vLLM is refused where it cannot run (no extra or no GPU), with the same care.
    if engine_problem(load_settings(["services.engine.kind=vllm"])) is not None:
        vllm = rollout("up", f"data_dir={data}", "services.engine.kind=vllm")
        assert vllm.returncode == 1 and "services.engine.kind=vllm needs" in vllm.stderr
        assert not data.exists()


def test_models_pull_without_a_network_fails_clearly_and_a_model_not_pulled_is_refused(
    tmp_path: Path,
) -> None:
    models = tmp_path / "models"
    offline = {"HF_ENDPOINT": f"http://127.0.0.1:{free_port()}", "HF_HUB_DISABLE_TELEMETRY": "1"}
    pulled = rollout("models", "pull", "qwen3-0.6b", f"models_dir={models}", env=offline)
    assert pulled.returncode == 1, pulled.stdout + pulled.stderr
    assert "could not download Qwen/Qwen3-0.6B" in pulled.stderr and "Traceback" not in pulled.stderr
    assert not (models / "qwen3-0.6b" / "config.json").exists()
    listed = rollout("models", "list", f"models_dir={models}", "--json")
    assert {row["name"]: row["pulled"] for row in json.loads(listed.stdout)} == dict.fromkeys(CATALOG, False)
    serve = rollout("engine", "serve", "--model", "qwen3-0.6b", "--no-follow", f"models_dir={models}")
    assert serve.returncode == 1 and "rollout models pull qwen3-0.6b" in serve.stderr
    assert "Traceback" not in serve.stderr
