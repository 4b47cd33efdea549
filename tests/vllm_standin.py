"""A stand-in for `vllm serve` where there is no GPU: vLLM's own OpenAI app and `AsyncLLM`, over a CPU
stand-in for its engine core. Named as a fake; its live counterpart is tests/test_vllm_gpu.py, against the
real engine.

`python -m tests.vllm_standin serve MODEL [vllm serve options]` takes exactly the arguments rollout's launcher
gives `vllm serve`, parses them with vLLM's own parser, validates them (`validate_parsed_serve_args`) and
builds vLLM's engine configuration from them, as `vllm serve` does, on a stand-in platform (vLLM's CPU
platform that admits sleep mode, as CUDA does). Then it serves vLLM's real FastAPI app (`build_app`,
`init_app_state`) over vLLM's real `AsyncLLM` (input processing, output processing, logprobs, detokenisation,
aborts, LoRA and sleep bookkeeping), with only the engine core replaced by `StandInCore`:
- the "model" draws a fixed cycle of tokens (`TOKENS`), one per running request every `STEP_S`, each with
  logprob `LOGPROB`, honouring `max_tokens`, EOS, `stop_token_ids` and the context length, as vLLM's
  `check_stop` does; at most `--max-num-seqs` requests run, the rest wait in arrival order;
- sleep and pause follow vLLM 0.33's engine core (`EngineCore.sleep`, `EngineCoreProc.pause_scheduler` and
  `pause_generation`) in what the tests rely on: `/sleep` in mode `abort` ends everything, running or waiting,
  with `abort`; `wait` lets the running requests finish and leaves the waiting ones queued; `keep` freezes
  all; a request that arrives asleep is queued until the wake; a `/pause` in mode `abort` or `wait` refuses
  new requests (retryable, which the app answers 503) from the moment it begins until resumed;
- with `--enable-prefix-caching`, a request's first output reports, as vLLM's scheduler does
  (`PrefillStats`), the prompt tokens held by a request of the same adapter before it: the longest shared
  prefix, in whole blocks (`--block-size`), never the prompt's last token. Not modelled: KV preemption,
  eviction from the prefix cache, and the tensors themselves;
- adding a LoRA adapter makes vLLM's worker's checks on its files (`adapter_config.json` within
  `--max-lora-rank`, and a tensors file), without reading the tensors.
With `ROLLOUT_VLLM_STANDIN_RECORD=PATH`, each request the engine core receives is appended to PATH as a JSON
line: its prompt, adapter and the `SamplingParams` vLLM derived from the HTTP request and the checkpoint (what
a real vLLM would sample with).

`python -m tests.vllm_standin judge` reads one JSON object on stdin and prints one JSON object (or, as `serve`
is starting, with `ROLLOUT_VLLM_STANDIN_JUDGE=PATH`, reads PATH and writes PATH.verdicts before it serves: one
vLLM import for both): for each of its `argvs` (`vllm serve ...` command lines), whether vLLM's parser and
engine-config validation accept it; for each of its `payloads` (bodies for `/v1/completions`), the keys vLLM's
`CompletionRequest` does not declare (vLLM drops them silently) or its validation error; for each of its
`responses` (`[class, body]`, class one of `CompletionResponse`, `CompletionStreamResponse`, `ErrorResponse`),
vLLM's validation error, if any.

Importing vLLM takes about 20 s on two cores: a test module starts one `serve` (judging too) at most.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from typing import Any
from unittest import mock

import numpy as np
import vllm.platforms as platforms
from vllm.platforms.cpu import CpuPlatform


class StandInPlatform(CpuPlatform):
    """vLLM's CPU platform, admitting sleep mode (as CUDA does): the configuration is then validated as on a
    GPU."""

    def is_sleep_mode_available(self) -> bool:
        return True


# Before any other vLLM import: they read the platform as they load.
platforms._current_platform = StandInPlatform()  # pyright: ignore[reportPrivateUsage]

from vllm.entrypoints.common.cli_args import make_arg_parser, validate_parsed_serve_args  # noqa: E402
from vllm.exceptions import LoRAAdapterNotFoundError  # noqa: E402
from vllm.lora.peft_helper import PEFTHelper  # noqa: E402
from vllm.outputs import RequestError  # noqa: E402
from vllm.utils.argparse_utils import FlexibleArgumentParser  # noqa: E402
from vllm.v1.engine import EngineCoreOutput, EngineCoreOutputs, FinishReason  # noqa: E402
from vllm.v1.engine.core_client import EngineCoreClient  # noqa: E402
from vllm.v1.metrics.stats import PrefillStats  # noqa: E402
from vllm.v1.outputs import LogprobsLists  # noqa: E402

TOKENS = (1000, 1001, 1002, 1003, 1004)
LOGPROB = -0.5
STEP_S = 0.01
RECORD_VARIABLE = "ROLLOUT_VLLM_STANDIN_RECORD"
JUDGE_VARIABLE = "ROLLOUT_VLLM_STANDIN_JUDGE"
SAMPLING_FIELDS = (
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "logprobs",
    "seed",
    "stop_token_ids",
    "skip_special_tokens",
    "max_tokens",
    "min_tokens",
    "ignore_eos",
)


class StandInCore(EngineCoreClient):
    """The engine-core client `AsyncLLM` talks to, answered in process (see the module contract)."""

    def __init__(self, vllm_config: Any) -> None:
        self.vllm_config = vllm_config
        self.max_model_len = vllm_config.model_config.max_model_len
        self.resources = type("Resources", (), {"engine_dead": False})()  # read by AsyncLLM.errored
        self.engine_ranks_managed = [0]  # read by the stat loggers
        self.running: dict[str, list[Any]] = {}  # request id -> [EngineCoreRequest, tokens drawn]
        self.waiting: dict[str, list[Any]] = {}  # beyond --max-num-seqs, or added while paused: queued
        self.max_running = vllm_config.scheduler_config.max_num_seqs
        self.pause = 0  # 0 running, 1 new requests held (abort, wait), 2 everything frozen (keep)
        self.reject_new = False  # a user pause (abort, wait) refuses new requests until resumed
        self.asleep: set[str] = set()  # the executor's sleeping tags
        self.loras: dict[int, Any] = {}
        self.prefix_caching = bool(vllm_config.cache_config.enable_prefix_caching)
        self.block_size = int(vllm_config.cache_config.block_size or 16)
        self.computed: list[
            tuple[int, list[int]]
        ] = []  # (adapter id, token ids) of requests seen, newest last
        self.outputs: asyncio.Queue[EngineCoreOutputs] = asyncio.Queue()
        self.drained = asyncio.Event()
        self.stepper: asyncio.Task[None] | None = None
        self.record = os.environ.get(RECORD_VARIABLE)

    async def add_request_async(self, request: Any) -> None:
        self._start()
        if self.record:
            _append_record(self.record, request)
        if self.reject_new:
            error = RequestError(
                "engine_paused", "Generation is paused. Please retry after it resumes.", retryable=True
            )
            finished = EngineCoreOutput(request.request_id, [], finish_reason=FinishReason.ERROR, error=error)
            self.outputs.put_nowait(
                EngineCoreOutputs(outputs=[finished], finished_requests={request.request_id})
            )
        else:
            self.waiting[request.request_id] = [request, 0]

    async def abort_requests_async(self, request_ids: Any) -> None:
        for request_id in request_ids:
            self.running.pop(request_id, None)
            self.waiting.pop(request_id, None)

    async def get_output_async(self) -> EngineCoreOutputs:
        self._start()
        return await self.outputs.get()

    def _start(self) -> None:
        if self.stepper is None:
            self.stepper = asyncio.get_running_loop().create_task(self._steps())

    async def _steps(self) -> None:
        while True:
            await asyncio.sleep(STEP_S)
            while self.pause == 0 and self.waiting and len(self.running) < self.max_running:
                request_id = next(iter(self.waiting))
                self.running[request_id] = self.waiting.pop(request_id)
            if self.pause == 2 or not self.running:
                continue
            drawn, finished = [], set()
            for request_id, entry in list(self.running.items()):
                output = self._draw(request_id, entry)
                drawn.append(output)
                if output.finish_reason is not None:
                    finished.add(request_id)
                    del self.running[request_id]
            self.outputs.put_nowait(EngineCoreOutputs(outputs=drawn, finished_requests=finished))
            if not self.running:
                self.drained.set()

    def _draw(self, request_id: str, entry: list[Any]) -> EngineCoreOutput:
        request, drawn = entry
        params = request.sampling_params
        token = TOKENS[drawn % len(TOKENS)]
        entry[1] = drawn = drawn + 1
        logprobs = None
        if params.logprobs is not None:  # the sampled token first, then the top k
            top = max(params.logprobs, 0)
            ids = [token] + [TOKENS[(drawn - 1 + j) % len(TOKENS)] for j in range(top)]
            logprobs = LogprobsLists(
                np.array([ids]), np.array([[LOGPROB] * (top + 1)], dtype=np.float32), np.array([1])
            )
        reason, stop_reason = None, None
        if token == params.eos_token_id and not params.ignore_eos:
            reason = FinishReason.STOP
        elif token in (params.stop_token_ids or ()):
            reason, stop_reason = FinishReason.STOP, token
        elif drawn >= params.max_tokens or len(request.prompt_token_ids or ()) + drawn >= self.max_model_len:
            reason = FinishReason.LENGTH
        return EngineCoreOutput(
            request_id,
            [token],
            new_logprobs=logprobs,
            finish_reason=reason,
            stop_reason=stop_reason,
            prefill_stats=self._prefilled(request) if drawn == 1 else None,
        )

    def _prefilled(self, request: Any) -> PrefillStats:
        """What the prefill of `request` took from the prefix cache: whole blocks of the longest prefix a
        request of the same adapter had before it, never the prompt's last token."""
        prompt: list[int] = [int(token) for token in request.prompt_token_ids or ()]
        adapter = request.lora_request.lora_int_id if request.lora_request is not None else 0
        held = 0
        if self.prefix_caching:
            for other_adapter, ids in self.computed:
                if other_adapter == adapter:
                    shared = next(
                        (i for i, (a, b) in enumerate(zip(prompt, ids, strict=False)) if a != b),
                        min(len(prompt), len(ids)),
                    )
                    held = max(held, shared)
            held = min(held, len(prompt) - 1) // self.block_size * self.block_size
            self.computed = [*self.computed[-255:], (adapter, prompt)]
        stats = PrefillStats()
        stats.set(num_prompt_tokens=len(prompt), num_local_cached_tokens=held, num_external_cached_tokens=0)
        return stats

    async def sleep_async(self, level: int = 1, mode: str = "abort") -> None:
        if mode not in ("abort", "wait", "keep"):
            raise ValueError(f"Invalid pause mode: {mode}")
        if mode == "abort":
            aborted = [*self.running, *self.waiting]
            self.running.clear()
            self.waiting.clear()
            if aborted:
                ends = [EngineCoreOutput(r, [], finish_reason=FinishReason.ABORT) for r in aborted]
                self.outputs.put_nowait(EngineCoreOutputs(outputs=ends, finished_requests=set(aborted)))
        self.pause = 2 if mode == "keep" else 1
        if mode == "wait" and self.running:
            self.drained.clear()
            await self.drained.wait()
        if level >= 1:
            self.asleep = {"weights", "kv_cache"}

    async def wake_up_async(self, tags: list[str] | None = None) -> bool:
        tags = None if tags is None else [t for t in tags if t != "scheduling"]
        if self.asleep and (tags is None or (tags and set(tags) <= self.asleep)):
            self.asleep = set() if tags is None else self.asleep - set(tags)
        if not self.asleep:
            self.pause, self.reject_new = 0, False
        return not self.asleep

    async def is_sleeping_async(self) -> bool:
        return self.pause != 0 or bool(self.asleep)

    async def pause_generation_async(self, mode: str = "abort", clear_cache: bool = True) -> None:
        self.reject_new = (
            mode != "keep"
        )  # from the moment the pause begins, as EngineCoreProc.pause_generation
        await self.sleep_async(0, mode)

    async def resume_scheduler_async(self) -> None:
        self.pause, self.reject_new = 0, False

    async def is_scheduler_paused_async(self) -> bool:
        return self.pause != 0

    async def add_lora_async(self, lora_request: Any) -> bool:
        _check_adapter_files(lora_request, self.max_model_len, self.vllm_config.lora_config)
        self.loras[lora_request.lora_int_id] = lora_request
        return True

    async def remove_lora_async(self, lora_id: int) -> bool:
        return self.loras.pop(lora_id, None) is not None

    async def list_loras_async(self) -> set[int]:
        return set(self.loras)

    async def pin_lora_async(self, lora_id: int) -> bool:
        return lora_id in self.loras

    async def get_supported_tasks_async(self) -> Any:
        return ("generate",)

    async def reset_mm_cache_async(self) -> None:
        return None

    async def reset_encoder_cache_async(self) -> None:
        return None

    async def reset_prefix_cache_async(
        self, reset_running_requests: bool = False, reset_connector: bool = False
    ) -> bool:
        return True

    def dp_engines_running(self) -> bool:
        return bool(self.running or self.waiting)

    def shutdown(self, timeout: float | None = None) -> None:
        if self.stepper is not None:
            self.stepper.cancel()


def _append_record(path: str, request: Any) -> None:
    params = request.sampling_params
    line = {
        "prompt": list(request.prompt_token_ids or ()),
        "lora": request.lora_request.lora_name if request.lora_request else None,
        "sampling": {name: _plain(getattr(params, name)) for name in SAMPLING_FIELDS},
    }
    with open(path, "a") as file:
        file.write(json.dumps(line) + "\n")


def _check_adapter_files(lora_request: Any, max_model_len: int, lora_config: Any) -> None:
    """What vLLM's worker checks of an adapter's files before it reads the tensors."""
    path = lora_request.lora_path
    if not os.path.isfile(os.path.join(path, "adapter_config.json")):
        raise LoRAAdapterNotFoundError(lora_request.lora_name, path)
    PEFTHelper.from_local_dir(path, max_model_len).validate_legal(lora_config)
    if not any(os.path.isfile(os.path.join(path, f"adapter_model.{ext}")) for ext in ("safetensors", "bin")):
        raise ValueError(f"{path} doesn't contain tensors")


def _plain(value: Any) -> Any:
    if isinstance(value, (set, frozenset, tuple)):
        return sorted(value) if isinstance(value, (set, frozenset)) else list(value)
    return value


def parse_serve_args(argv: list[str]) -> Any:
    """`vllm serve`'s own parsing and checks of `argv` (the arguments after `serve`)."""
    args: Any = make_arg_parser(FlexibleArgumentParser()).parse_args(argv)
    if args.model_tag is not None:
        args.model = args.model_tag
    validate_parsed_serve_args(args)
    return args


def engine_config(args: Any) -> Any:
    from vllm.engine.arg_utils import AsyncEngineArgs

    return AsyncEngineArgs.from_cli_args(args).create_engine_config()


async def serve(argv: list[str]) -> None:
    import uvicorn
    from vllm.entrypoints.launchers.api_server.app_state import init_app_state
    from vllm.entrypoints.launchers.app import build_app
    from vllm.v1.engine.async_llm import AsyncLLM

    if asked := os.environ.get(JUDGE_VARIABLE):
        judge_file(asked)
    args = parse_serve_args(argv)
    config = engine_config(args)
    with mock.patch.object(
        EngineCoreClient, "make_async_mp_client", lambda vllm_config, **_: StandInCore(vllm_config)
    ):
        engine = AsyncLLM(vllm_config=config, executor_class=None, log_stats=False)  # pyright: ignore[reportArgumentType]
    tasks = await engine.get_supported_tasks()
    app = build_app(args, tasks, engine.model_config)
    await init_app_state(engine, app.state, args, tasks)
    server = uvicorn.Server(
        uvicorn.Config(app, host=args.host or "127.0.0.1", port=args.port, log_level="warning")
    )
    await server.serve()


def judge(request: dict[str, Any]) -> dict[str, Any]:
    from vllm.entrypoints.openai.completion.protocol import (
        CompletionRequest,
        CompletionResponse,
        CompletionStreamResponse,
    )
    from vllm.entrypoints.serve.engine.protocol import ErrorResponse

    argvs = []
    for argv in request.get("argvs", []):
        try:
            assert argv[:2] == ["vllm", "serve"], f"not a vllm serve command: {argv[:2]}"
            args = parse_serve_args(argv[2:])
            config = engine_config(args)
            argvs.append(
                {
                    "ok": True,
                    "prefix_caching": bool(config.cache_config.enable_prefix_caching),
                    "prompt_tokens_details": bool(args.enable_prompt_tokens_details),
                }
            )
        except BaseException as error:  # argparse exits; validation raises
            argvs.append({"ok": False, "error": f"{type(error).__name__}: {error}"})
    declared = {name for name, field in CompletionRequest.model_fields.items()} | {
        field.alias for field in CompletionRequest.model_fields.values() if field.alias
    }
    payloads = []
    for payload in request.get("payloads", []):
        try:
            CompletionRequest.model_validate(payload)
            payloads.append({"ok": True, "undeclared": sorted(set(payload) - declared)})
        except Exception as error:
            payloads.append({"ok": False, "error": str(error)})
    classes = {
        "CompletionResponse": CompletionResponse,
        "CompletionStreamResponse": CompletionStreamResponse,
        "ErrorResponse": ErrorResponse,
    }
    responses = []
    for name, body in request.get("responses", []):
        try:
            classes[name].model_validate(body)
            responses.append({"ok": True})
        except Exception as error:
            responses.append({"ok": False, "error": str(error)})
    return {"argvs": argvs, "payloads": payloads, "responses": responses}


def judge_file(path: str) -> None:
    """Judge the request in `path`; the verdicts appear whole at `path`.verdicts."""
    with open(path) as file:
        verdicts = judge(json.load(file))
    with open(f"{path}.verdicts.part", "w") as file:
        json.dump(verdicts, file)
    os.replace(f"{path}.verdicts.part", f"{path}.verdicts")


def main(argv: list[str]) -> None:
    if argv[:1] == ["serve"]:
        asyncio.run(serve(argv[1:]))
    elif argv[:1] == ["judge"]:
        print(json.dumps(judge(json.load(sys.stdin))))
    else:
        raise SystemExit("usage: python -m tests.vllm_standin serve MODEL [options] | judge < request.json")


if __name__ == "__main__":
    main(sys.argv[1:])
