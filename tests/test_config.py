import dataclasses
import re
import types
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import pytest

from rollout import config
from rollout.run.settings import BadRunSetting, RunSettings, RunSettingsChange
from rollout.workflows.run_types import RunInput


def test_overrides_compose_onto_the_defaults() -> None:
    settings = config.load(["services.temporal.ui_port=8300", "data_dir=/tmp/r"])
    assert settings.services.temporal.ui_port == 8300
    assert settings.temporal_ui_url == "http://127.0.0.1:8300"
    assert settings.ledger_url == "postgresql://postgres@127.0.0.1:54329/rollout"
    assert settings.worker_ledger_url == "postgresql://rollout_worker@127.0.0.1:54329/rollout"
    assert settings.blob_url == "file:///tmp/r/blobs"


def test_the_embedded_servers_urls_carry_the_passwords_it_made(tmp_path: Path) -> None:
    settings = config.load([f"data_dir={tmp_path}"])
    assert settings.ledger_url == "postgresql://postgres@127.0.0.1:54329/rollout", "no server made any yet"
    for user, password in (("postgres", "owner-pw"), ("rollout_worker", "worker-pw")):
        (tmp_path / f"ledger-{user}.password").write_text(password)
    assert settings.ledger_url == "postgresql://postgres:owner-pw@127.0.0.1:54329/rollout"
    assert settings.worker_ledger_url == "postgresql://rollout_worker:worker-pw@127.0.0.1:54329/rollout"


def test_external_services_replace_the_embedded_addresses() -> None:
    settings = config.load(
        [
            "services.postgres.url=postgresql://u:pw@db:5432/x",
            "services.temporal.address=temporal:7233",
            "services.temporal.ui_url=http://temporal-ui:8080",
        ]
    )
    assert settings.ledger_url == "postgresql://u:pw@db:5432/x"
    assert settings.worker_ledger_url == "postgresql://u:pw@db:5432/x"  # no worker URL given: the one URL
    given = config.load(
        [
            "services.postgres.url=postgresql://u:pw@db/x",
            "services.postgres.worker_url=postgresql://w:pw2@db/x",
        ]
    )
    assert (given.ledger_url, given.worker_ledger_url) == (
        "postgresql://u:pw@db/x",
        "postgresql://w:pw2@db/x",
    )
    # The dashboard's and sandbox hosts' URLs fall back to the workers' unless given.
    assert given.reader_ledger_url == given.sandbox_ledger_url == "postgresql://w:pw2@db/x"
    roles = config.load(
        [
            "services.postgres.reader_url=postgresql://r@db/x",
            "services.postgres.sandbox_url=postgresql://s@db/x",
        ]
    )
    assert (roles.reader_ledger_url, roles.sandbox_ledger_url) == (
        "postgresql://r@db/x",
        "postgresql://s@db/x",
    )
    assert settings.temporal_address == "temporal:7233"
    assert settings.temporal_ui_url == "http://temporal-ui:8080"


def test_an_unknown_key_is_named_with_the_valid_ones() -> None:
    with pytest.raises(config.ConfigError) as raised:
        config.load(["services.postgres.prot=1"])
    assert str(raised.value) == (
        "unknown setting 'services.postgres.prot'. Valid keys under services.postgres: url, worker_url, "
        "reader_url, sandbox_url, gateway_url, runner_url, trainer_url, serving_url, host, port, database"
    )


def test_a_bad_value_names_the_key_and_what_is_expected() -> None:
    with pytest.raises(config.ConfigError, match=r"'services.temporal.ui_port'.*Integer"):
        config.load(["services.temporal.ui_port=abc"])
    with pytest.raises(
        config.ConfigError, match=r"'log_level'.*expected one of \[DEBUG, INFO, WARNING, ERROR\]"
    ):
        config.load(["log_level=LOUD"])


def test_the_data_dir_follows_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ROLLOUT_DATA_DIR", "/srv/rollout")
    assert str(config.load().data_path) == "/srv/rollout"


def test_a_lora_rank_vllm_does_not_serve_is_refused_when_the_settings_are_loaded() -> None:
    """vLLM's `--max-lora-rank` takes only its own choices: 24 would pass every check here and then stop
    `vllm serve` on the GPU machine."""
    with pytest.raises(
        config.ConfigError, match="vllm_max_lora_rank': 24 is not a rank vLLM serves; choose one of 1, 8"
    ):
        config.load(["services.engine.vllm_max_lora_rank=24"])
    assert config.load(["services.engine.vllm_max_lora_rank=320"]).services.engine.vllm_max_lora_rank == 320


def test_a_negative_prefix_cache_budget_is_refused_naming_the_setting() -> None:
    with pytest.raises(config.ConfigError, match=r"'services\.engine\.prefix_cache_mb': -1 is not a size"):
        config.load(["services.engine.prefix_cache_mb=-1"])
    assert config.load(["services.engine.prefix_cache_mb=0"]).services.engine.prefix_cache_mb == 0


def test_a_trainer_setting_out_of_range_is_refused_naming_it_in_one_line() -> None:
    """`trainer.groups_per_batch=0` played episodes forever and never trained; each trainer setting out of its
    range is refused when the settings load, before anything starts."""
    with pytest.raises(config.ConfigError) as raised:
        config.load(["trainer.groups_per_batch=0"])
    assert str(raised.value) == (
        "bad value for 'trainer.groups_per_batch': 0 would play episodes forever and never train; set 1 or more "
        "groups per step"
    )
    with pytest.raises(
        config.ConfigError, match=r"^bad value for 'trainer\.refill_max': -1 is not a number"
    ) as raised:
        config.load(["trainer.refill_max=-1"])
    assert "\n" not in str(raised.value)
    for bad in (
        "steps=0",
        "learning_rate=0",
        "learning_rate=-1e-5",
        "max_grad_norm=0",
        "micro_batch_tokens=0",
        "updates_per_batch=0",
        "lora_rank=-1",
        "data_parallel_workers=0",
    ):
        key = bad.partition("=")[0]
        with pytest.raises(config.ConfigError, match=rf"^bad value for 'trainer\.{key}'"):
            config.load([f"trainer.{bad}"])
    loaded = config.load(["trainer.refill_max=0", "trainer.lora_rank=0"])
    assert (loaded.trainer.refill, loaded.trainer.refill_max) == (True, 0), "refill is on by default"
    assert config.load().trainer.refill_max is None, "None: as many as groups_per_batch"


def _numeric_settings(schema: type, prefix: str = "") -> Iterator[tuple[str, type]]:
    """Every numeric setting of the schema, by dotted key, with its type (int or float), read from the
    dataclasses themselves: a setting added later is walked too."""
    for spec in dataclasses.fields(schema):
        hint = typing.get_type_hints(schema)[spec.name]
        union = typing.get_origin(hint) in (typing.Union, types.UnionType)
        kinds = {a for a in typing.get_args(hint) if a is not type(None)} if union else {hint}
        key = f"{prefix}{spec.name}"
        if len(kinds) == 1 and dataclasses.is_dataclass(kind := next(iter(kinds))):
            yield from _numeric_settings(cast(type, kind), f"{key}.")
        elif kinds & {int, float} and bool not in kinds:
            yield key, float if float in kinds else int


def test_every_numeric_setting_out_of_range_is_refused_in_one_line_that_names_it_and_its_range() -> None:
    """Each numeric setting, walked from the schema: a negative value, and for a float NaN and infinity, is
    refused when the settings load, in one line that names the key and says what to set."""
    walked = dict(_numeric_settings(config.Settings))
    assert (
        len(walked) > 40
        and "services.gateway.max_context" in walked
        and walked["trainer.learning_rate"] is float
    )
    walked |= {"policies.speaker.lora_rank": int, "policies.speaker.learning_rate": float}
    for key, kind in walked.items():
        for bad in ("-1", "nan", "inf") if kind is float else ("-1",):
            with pytest.raises(config.ConfigError) as raised:
                config.load([f"{key}={bad}"])
            said = str(raised.value)
            assert said.startswith(f"bad value for '{key}': "), (key, bad, said)
            assert "\n" not in said and re.search(r"\bset\b|it takes|choose", said), (key, bad, said)
    config.load()  # and every default is in range


def test_a_quantization_the_trainer_cannot_run_is_refused_when_the_settings_load() -> None:
    """Both were found only once the trainer worker loaded its model."""
    with pytest.raises(config.ConfigError, match=r"^bad value for 'trainer\.quantization': 'int3' is not"):
        config.load(["trainer.quantization=int3"])
    with pytest.raises(config.ConfigError, match=r"lora_rank=0 trains the full weights"):
        config.load(["trainer.quantization=nf4", "trainer.lora_rank=0"])
    assert config.load(["trainer.quantization=nf4"]).trainer.quantization == "nf4"


def test_a_max_lag_that_would_admit_no_turn_is_refused_wherever_it_enters() -> None:
    """A negative max_lag admits no turn (each waits out its budget, then 503): refused at the config, at a
    run's input, and when a run's recorded settings are read back from the ledger."""
    with pytest.raises(config.ConfigError, match=r"bad value for 'run\.max_lag': -1"):
        config.load(["run.max_lag=-1"])
    with pytest.raises(BadRunSetting, match="bad value for 'max_lag': -1"):
        RunInput(run="r", environment="e", settings=RunSettings(max_lag=-1))
    with pytest.raises(BadRunSetting, match="'max_lag'"):
        RunSettings.from_recorded({"max_lag": "2"})
    with pytest.raises(BadRunSetting, match="'max_tokens'"):
        RunSettings.from_recorded({"max_tokens": -5})
    with pytest.raises(BadRunSetting, match="'paused'"):
        RunSettings.from_recorded({"paused": "yes"})
    recorded_coach = RunSettings(external_models={"coach": "gpt"}).recorded()
    with pytest.raises(BadRunSetting, match="coach"):
        RunSettings.from_recorded({**recorded_coach, **{k: 7 for k in recorded_coach if k.endswith("coach")}})
    given = RunSettings(
        max_lag=3, paused=True, pause_reason="a gate", external_models={"coach": "gpt@http://x"}
    )
    assert RunSettings.from_recorded(given.recorded()) == given, "the ledger's form reads back as it was"
    assert RunSettings.from_recorded({}) == RunSettings(), "absent settings are the defaults"
    resumed = given.changed(RunSettingsChange(paused=False, pause_reason=""))
    assert (resumed.paused, resumed.pause_reason, resumed.max_lag) == (False, None, 3)
    with pytest.raises(BadRunSetting, match="'max_lag'"):
        RunSettingsChange(max_lag=-1)


OWN_LOSS = '''
from dataclasses import dataclass

from rollout.rl.losses import TokenLoss, TokenTerms


@dataclass(frozen=True)
class ScaledReinforce:
    """REINFORCE with every token's weight `scale`: a researcher's own loss, in their own folder."""

    scale: float = 1.0
    name = "scaled_reinforce"
    tinker = None

    def tinker_config(self) -> dict[str, float]:
        return {}

    def __call__(self, terms: TokenTerms) -> TokenLoss:
        weight = terms.mask * self.scale
        return TokenLoss(-weight * terms.advantages * terms.logprobs, weight, terms.mask * 0)


not_a_loss = object()
'''


def test_a_loss_and_its_parameters_are_settings_checked_when_they_load(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The built-in losses take their parameters from the configuration; a researcher's own loss is named by
    its import path, from the folder they work in, as an environment is; anything wrong is one line at load,
    and a run on Tinker refuses a loss Tinker lacks then, not at its first step."""
    import torch

    from rollout.rl.losses import PPO, LossConfig, policy_loss

    loaded = config.load(
        [
            "trainer.loss_params.clip_high=0.3",
            "trainer.loss_params.is_cap=3",
            "trainer.token_mask_bounds=[0.5,2.0]",
        ]
    )
    assert config.loss_config(loaded.trainer) == LossConfig(
        PPO(is_cap=3.0, clip_high=0.3), token_mask_bounds=(0.5, 2.0)
    )

    (tmp_path / "my_losses.py").write_text(OWN_LOSS)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    own = config.load(["trainer.loss=my_losses:ScaledReinforce", "trainer.loss_params.scale=0.5"])
    made = config.loss_config(own.trainer)
    assert made.loss.name == "scaled_reinforce" and cast(Any, made.loss).scale == 0.5
    logprobs = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    loss, metrics = policy_loss(logprobs, logprobs.detach(), torch.ones((1, 2)), torch.ones((1, 2)), made)
    assert loss.item() == pytest.approx(0.5 * (1.0 + 2.0) / 2) and metrics.tokens == 2

    refusals = {
        (
            "trainer.loss=nope",
        ): r"^bad value for 'trainer\.loss': no loss 'nope': name a built-in one \(ppo, ",
        (
            "trainer.loss_params.clip_hi=0.3",
        ): r"^bad value for 'trainer\.loss_params': loss ppo does not take",
        (
            "trainer.loss_params.clip_low=1.5",
        ): r"^bad value for 'trainer\.loss_params': loss ppo: clip_low 1\.5: set 0 or more",
        (
            "trainer.loss=my_losses:not_a_loss",
        ): r"^bad value for 'trainer\.loss': my_losses:not_a_loss is a object",
        ("trainer.loss=my_losses:Missing",): r"has no attribute 'Missing'",
        ("trainer.loss=elsewhere:Loss",): r"module 'elsewhere' does not import",
        (
            "trainer.token_mask_bounds=[2.0,0.5]",
        ): r"^bad value for 'trainer\.token_mask_bounds': \[2\.0, 0\.5\]",
        ("trainer.loss=my_losses:ScaledReinforce", "trainer.provider=tinker"): r"Tinker has no loss like",
        ("trainer.token_mask_bounds=[0.5,2.0]", "trainer.provider=tinker"): r"Tinker's losses mask no token",
    }
    for overrides, said in refusals.items():
        with pytest.raises(config.ConfigError, match=said) as raised:
            config.load(list(overrides))
        assert "\n" not in str(raised.value), overrides


def test_an_advantage_method_is_checked_when_the_settings_load() -> None:
    assert config.load(["trainer.advantage=leave_one_out"]).trainer.advantage == "leave_one_out"
    assert config.load(["trainer.advantage=statistics:fmean"]).trainer.advantage == "statistics:fmean"
    for wrong, said in (("grpo", "no advantage method 'grpo'"), ("math:pi", "is a float, not a function")):
        with pytest.raises(config.ConfigError, match=rf"^bad value for 'trainer\.advantage': .*{said}"):
            config.load([f"trainer.advantage={wrong}"])
