"""Eval suites: a name, a version, and the environments to score, each on its held-out tasks.

Contract:
- A suite is declared in YAML (a file holding one mapping: `name`, `version`, `environments`) or in Python (a
  `Suite` value, named `package.module:attribute` or found in a `.py` file); `load_suite(source)` reads either
  and raises `SuiteError` naming the source and the offending field.
- Each `EvalEnvironment` names an environment (`package.module:attribute`), its tasks (`eval`: the
  environment's held-out `eval_source`, the default; or `seed: N`, generator tasks under a seed training does
  not use), the first task index, the number of episodes, sampling settings (temperature 0 by default: greedy)
  and the metric (rollout.evals.scoring). Its `name` (default: the environment's package, or
  `package.attribute` for an attribute other than `environment`) is unique in the suite and names its scores.
- `Suite.payload()` is the canonical JSON of the declaration and `content_hash()` its SHA-256: the same suite
  written in YAML or Python, in any key order, has one hash. The ledger keeps a suite under `name@version`
  with that hash (rollout.evals.records).
- Names and versions are letters, digits, `.`, `_` and `-` (a YAML version `3` is the version "3").
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from rollout.environment import EVAL_TASKS
from rollout.evals.scoring import check_metric
from rollout.references import ReferenceLoadError, import_reference

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
SHIPPED = Path(__file__).parent / "shipped"


class SuiteError(ValueError):
    """A suite declaration that cannot be used, with the source and field that are wrong."""


@dataclass(frozen=True)
class EvalEnvironment:
    """One environment of a suite and how it is scored."""

    environment: str
    episodes: int = 10
    tasks: str = EVAL_TASKS  # `eval` (held out), or `seed:N`
    first: int = 0  # the first task index of the selection
    temperature: float = 0.0
    max_tokens: int | None = None
    metric: str = "mean_reward"  # mean_reward, pass_rate, or package.module:function
    threshold: float = 1.0  # pass_rate: an episode passes at a reward of at least this
    name: str = ""

    def __post_init__(self) -> None:
        if not self.name:
            module, _, attribute = self.environment.partition(":")
            package = module.split(".")[0]
            default = package if attribute in ("environment", "") else f"{package}.{attribute}"
            object.__setattr__(self, "name", default)


@dataclass(frozen=True)
class Suite:
    name: str
    version: str
    environments: tuple[EvalEnvironment, ...]
    description: str = ""

    @property
    def ref(self) -> str:
        return f"{self.name}@{self.version}"

    def payload(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "version": self.version,
            "description": self.description,
            "environments": [asdict(e) for e in self.environments],
        }

    def content_hash(self) -> str:
        canonical = json.dumps(self.payload(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()

    def environment(self, name: str) -> EvalEnvironment:
        for entry in self.environments:
            if entry.name == name:
                return entry
        raise SuiteError(
            f"suite {self.ref} has no environment {name!r} (it has {', '.join(e.name for e in self.environments)})"
        )


SUITE_FIELDS = ("name", "version", "description", "environments")
ENVIRONMENT_FIELDS = (
    "environment",
    "episodes",
    "tasks",
    "seed",
    "first",
    "temperature",
    "max_tokens",
    "metric",
    "threshold",
    "name",
)


def suite_from_payload(data: Any, source: str = "the suite") -> Suite:
    """A `Suite` from its mapping (a YAML file's content, or a recorded payload); `SuiteError` says what is
    wrong."""
    if not isinstance(data, dict):
        raise SuiteError(f"{source}: a suite is a mapping with name, version and environments")
    unknown = sorted(set(data) - set(SUITE_FIELDS))
    if unknown:
        raise SuiteError(
            f"{source}: unknown field(s) {', '.join(unknown)}; a suite has {', '.join(SUITE_FIELDS)}"
        )
    name, version = _token(data.get("name"), "name", source), _token(data.get("version"), "version", source)
    entries = data.get("environments")
    if not isinstance(entries, list) or not entries:
        raise SuiteError(f"{source}: `environments` must be a non-empty list")
    environments = tuple(
        _environment(entry, f"{source}, environments[{i}]") for i, entry in enumerate(entries)
    )
    return _checked(
        Suite(name, version, environments, description=str(data.get("description") or "")), source
    )


def _token(value: Any, what: str, source: str) -> str:
    text = str(value) if isinstance(value, (str, int)) and not isinstance(value, bool) else ""
    if not _NAME.match(text):
        raise SuiteError(f"{source}: `{what}` must be letters, digits, '.', '_' or '-' (got {value!r})")
    return text


def _environment(entry: Any, source: str) -> EvalEnvironment:
    if isinstance(entry, str):
        entry = {"environment": entry}
    if not isinstance(entry, dict):
        raise SuiteError(f"{source}: an environment is a reference or a mapping with `environment`")
    unknown = sorted(set(entry) - set(ENVIRONMENT_FIELDS))
    if unknown:
        raise SuiteError(
            f"{source}: unknown field(s) {', '.join(unknown)}; allowed: {', '.join(ENVIRONMENT_FIELDS)}"
        )
    values = dict(entry)
    if "seed" in values:
        seed = values.pop("seed")
        if not isinstance(seed, int) or isinstance(seed, bool):
            raise SuiteError(f"{source}: `seed` must be a whole number, not {seed!r}")
        values["tasks"] = f"seed:{seed}"
    try:
        return EvalEnvironment(**values)
    except TypeError as error:
        raise SuiteError(f"{source}: {error}") from None


def _checked(suite: Suite, source: str) -> Suite:
    names = [e.name for e in suite.environments]
    if len(set(names)) != len(names):
        raise SuiteError(f"{source}: two environments are named alike ({names}): give each a `name`")
    for entry in suite.environments:
        where = f"{source}, environment {entry.name!r}"
        if ":" not in entry.environment:
            raise SuiteError(
                f"{where}: `environment` must be package.module:attribute, not {entry.environment!r}"
            )
        if not isinstance(entry.episodes, int) or isinstance(entry.episodes, bool) or entry.episodes < 1:
            raise SuiteError(
                f"{where}: `episodes` must be a whole number of at least 1, not {entry.episodes!r}"
            )
        if not isinstance(entry.first, int) or entry.first < 0:
            raise SuiteError(f"{where}: `first` must be a whole number of at least 0, not {entry.first!r}")
        if entry.tasks != EVAL_TASKS and not re.fullmatch(r"seed:-?\d+", entry.tasks):
            raise SuiteError(f"{where}: `tasks` must be `eval` or a `seed: N`, not {entry.tasks!r}")
        if not isinstance(entry.temperature, (int, float)) or entry.temperature < 0:
            raise SuiteError(
                f"{where}: `temperature` must be a number of at least 0, not {entry.temperature!r}"
            )
        if entry.max_tokens is not None and (not isinstance(entry.max_tokens, int) or entry.max_tokens < 1):
            raise SuiteError(
                f"{where}: `max_tokens` must be a whole number of at least 1, not {entry.max_tokens!r}"
            )
        if not _NAME.match(entry.name):
            raise SuiteError(f"{where}: `name` must be letters, digits, '.', '_' or '-'")
        try:
            check_metric(entry.metric, entry.threshold)
        except ValueError as error:
            raise SuiteError(f"{where}: {error}") from None
    return suite


def load_suite(source: str) -> Suite:
    """The suite in a YAML file, a Python file (its one `Suite` value), `package.module:attribute`, or the
    shipped suite of that name (`smoke`)."""
    path = Path(source)
    if path.suffix in (".yaml", ".yml", ".py") or path.exists():
        if not path.is_file():
            raise SuiteError(f"{source}: no such file")
        if path.suffix == ".py":
            return _from_python_file(path)
        return _from_yaml(path.read_text(), source)
    if ":" in source:
        try:
            value = import_reference(source, "suite reference")
        except ReferenceLoadError as error:
            raise SuiteError(str(error)) from None
        if not isinstance(value, Suite):
            raise SuiteError(f"{source} is a {type(value).__name__}, not a rollout.evals.Suite")
        return _checked(value, source)
    shipped = SHIPPED / f"{source}.yaml"
    if shipped.is_file():
        return _from_yaml(shipped.read_text(), source)
    raise SuiteError(
        f"no suite {source!r}: give a YAML or Python file, package.module:attribute, or a shipped suite "
        f"({', '.join(shipped_names())})"
    )


def shipped_names() -> list[str]:
    return sorted(p.stem for p in SHIPPED.glob("*.yaml"))


def _from_yaml(text: str, source: str) -> Suite:
    import yaml

    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as error:
        raise SuiteError(f"{source} is not valid YAML: {error}") from None
    return suite_from_payload(data, source)


def _from_python_file(path: Path) -> Suite:
    import importlib.util

    spec = importlib.util.spec_from_file_location(f"rollout_suite_{path.stem}", path)
    if spec is None or spec.loader is None:
        raise SuiteError(f"{path}: not a Python module")
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as error:
        raise SuiteError(f"{path} does not run: {type(error).__name__}: {error}") from None
    found = [v for v in vars(module).values() if isinstance(v, Suite)]
    if len(found) != 1:
        raise SuiteError(f"{path}: a suite file defines exactly one rollout.evals.Suite (found {len(found)})")
    return _checked(found[0], str(path))


__all__ = ["EvalEnvironment", "Suite", "SuiteError", "load_suite", "suite_from_payload"]
