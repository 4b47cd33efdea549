"""The vLLM launch command; and, where vLLM and a GPU exist, the real thing driven by rollout's engine
client."""

from __future__ import annotations

import asyncio
import importlib.util
import os
import time
from pathlib import Path

import pytest

from rollout.config import load
from rollout.config.defaults import LORA_TARGET_MODULES
from rollout.engines.vllm_launcher import VLLMLaunch, command, launch_for
from rollout.serving.keys import engine_api_key
from rollout.training.local import LocalTrainerConfig

KEY = engine_api_key(b"k" * 64)


def test_the_command_enables_runtime_lora_and_sleep_mode() -> None:
    argv, env = command(
        VLLMLaunch("Qwen/Qwen3-8B", port=8200, max_model_len=16384, quantization="bitsandbytes", api_key=KEY)
    )
    assert argv[:3] == ["vllm", "serve", "Qwen/Qwen3-8B"]
    assert argv[argv.index("--port") + 1] == "8200"
    assert "--enable-lora" in argv and "--enable-sleep-mode" in argv
    assert argv[argv.index("--max-model-len") + 1] == "16384"
    assert argv[argv.index("--quantization") + 1] == "bitsandbytes"
    assert env == {
        "VLLM_API_KEY": KEY,
        "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True",
        "VLLM_SERVER_DEV_MODE": "1",
    }
    # Without it, vLLM fills what a request leaves out (top_k, min_p, penalties) from the checkpoint's
    # generation_config.json, and the recorded logprob no longer describes the distribution that drew the
    # token.
    assert argv[argv.index("--generation-config") + 1] == "vllm"
    assert argv[argv.index("--logprobs-mode") + 1] == "raw_logprobs"
    assert "--language-model-only" in argv, "no vision tower loaded, profiled or cached: turns are text"
    assert "--max-num-seqs" not in argv, "vLLM's own default unless asked"
    # LoRA slots for what the trainer's adapters train, not every module vLLM supports (the budget counts
    # these).
    start = argv.index("--lora-target-modules") + 1
    assert tuple(argv[start : start + 4]) == LocalTrainerConfig().target_modules == LORA_TARGET_MODULES
    bounded, _ = command(VLLMLaunch("m", max_num_seqs=8, api_key=KEY))
    assert bounded[bounded.index("--max-num-seqs") + 1] == "8"
    plain, plain_env = command(VLLMLaunch("m", lora=False, sleep_mode=False, api_key=KEY))
    assert "--enable-lora" not in plain and "--enable-sleep-mode" not in plain
    assert plain_env == {"VLLM_API_KEY": KEY}, "a vLLM without LoRA or sleep still demands the key"


def test_the_engine_api_key_goes_in_the_environment_never_on_the_command_line() -> None:
    """`ps` shows every process's arguments to every user of the machine: vLLM reads the key from
    VLLM_API_KEY (its default for --api-key), never from argv; the launch's repr does not show it either."""
    settings = load(["services.engine.kind=vllm", "services.engine.vllm_extra_args=[--seed,1]"])
    launch = launch_for(settings, "m", host="127.0.0.1", port=8100, served_name="base", api_key=KEY)
    argv, env = command(launch)
    assert env["VLLM_API_KEY"] == KEY
    assert not any(KEY in argument for argument in argv) and "--api-key" not in argv
    assert KEY not in repr(launch)
    with pytest.raises(ValueError, match="API key"):
        command(VLLMLaunch("m", api_key=""))
    # The locked vLLM (0.33) reads it as --api-key's default: the launcher relies on this.
    if (vllm := importlib.util.find_spec("vllm")) is not None and vllm.origin is not None:
        register = Path(vllm.origin).parent / "entrypoints" / "serve" / "middleware" / "register.py"
        assert "args.api_key or [envs.VLLM_API_KEY]" in register.read_text()


def _gpu() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except ImportError:
        return False


@pytest.mark.gpu
@pytest.mark.skipif(
    not _gpu() or importlib.util.find_spec("vllm") is None, reason="needs vLLM and a CUDA GPU"
)
async def test_real_vllm_samples_token_ids_with_logprobs(tiny_qwen3: str) -> None:
    from rollout.engines.protocol import SampleRequest
    from rollout.engines.vllm_client import VLLMEngine
    from rollout.net import free_port

    port = free_port()
    argv, env = command(
        VLLMLaunch(tiny_qwen3, port=port, gpu_memory_utilization=0.3, max_model_len=2048, api_key=KEY)
    )
    server = await asyncio.create_subprocess_exec(*argv, env={**os.environ, **env})
    client = VLLMEngine(f"http://127.0.0.1:{port}", api_key=KEY)
    try:
        deadline = time.monotonic() + 600
        while not await client.health():
            assert server.returncode is None and time.monotonic() < deadline, "vllm serve did not come up"
            await asyncio.sleep(2)
        result = await client.sample(
            SampleRequest((151644, 872, 198, 6023, 151645, 198), max_tokens=8, seed=1)
        )
        assert len(result.completion_ids) == len(result.logprobs) > 0
        # Streamed with the same seed: the same tokens, token by token, with their logprobs.
        chunks = [
            c
            async for c in client.stream(
                SampleRequest((151644, 872, 198, 6023, 151645, 198), max_tokens=8, seed=1)
            )
        ]
        assert tuple(t for c in chunks for t in c.ids) == result.completion_ids
        assert len([x for c in chunks for x in c.logprobs]) == len(result.logprobs)
        assert chunks[-1].finish_reason == result.finish_reason
        await client.sleep()
        await client.wake()
    finally:
        await client.close()
        server.terminate()
        await server.wait()
