"""The container recipe (issue 20): ``Dockerfile`` and ``compose.yaml`` ask only for what exists.

Docker's daemon is not available on the machines this suite runs on, so the image is not built
here. What can go stale without one is checked instead: every command the recipe runs parses
with the real CLI (unknown commands or options fail), every ``MEMSTORE_*`` variable is a real
setting, the files the image copies exist, its extras are the package's, and compose migrates
before the API and the worker start.
"""

from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path
from typing import Any

import click
import pytest
import yaml
from fastapi.testclient import TestClient

from memstore.cli import main
from memstore.cli.listening import allowed_hosts_or_fail
from memstore.cli.serve_app import create_app, fixed_user
from memstore.config import MemoryConfig

ROOT = Path(__file__).resolve().parents[2]


def _parses(argv: list[str]) -> None:
    """Resolve ``argv`` down to its leaf command and parse the leaf's options, as click would."""
    command: click.Command = main
    ctx = click.Context(main, info_name="memstore")
    args = list(argv)
    while isinstance(command, click.Group):
        name, *args = args
        sub = command.get_command(ctx, name)
        assert sub is not None, f"memstore has no command {name!r} ({argv})"
        ctx = click.Context(sub, info_name=name, parent=ctx)
        command = sub
    command.parse_args(ctx, args)  # raises click.UsageError on an unknown option or a bad value


def _compose() -> dict[str, Any]:
    loaded = yaml.safe_load((ROOT / "compose.yaml").read_text(encoding="utf-8"))
    assert isinstance(loaded, dict)
    return loaded


def _memstore_services(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {name: spec for name, spec in compose["services"].items() if spec.get("build") == "."}


def test_compose_commands_parse_with_the_cli_and_the_schema_is_migrated_first() -> None:
    services = _memstore_services(_compose())
    assert set(services) == {"migrate", "api", "worker"}
    for name, spec in services.items():
        _parses(spec["command"])
        for variable in spec["environment"]:
            if variable.startswith("MEMSTORE_"):
                assert variable[len("MEMSTORE_") :].lower() in MemoryConfig.model_fields, (name, variable)
    assert services["migrate"]["command"] == ["db", "upgrade"]
    for name in ("api", "worker"):
        assert services[name]["depends_on"] == {"migrate": {"condition": "service_completed_successfully"}}
    assert "/readyz" in json.dumps(services["api"]["healthcheck"])


def test_a_misspelt_option_would_fail_this_check() -> None:
    with pytest.raises(click.UsageError):
        _parses(["serve", "--user-headr", "X-Forwarded-User"])
    with pytest.raises(AssertionError):
        _parses(["wroker"])


def test_the_dockerfile_copies_what_exists_and_installs_real_extras() -> None:
    dockerfile = (ROOT / "Dockerfile").read_text(encoding="utf-8")
    for sources in re.findall(r"^COPY (.+) \S+$", dockerfile, re.MULTILINE):
        for source in sources.split():
            assert (ROOT / source).exists(), source
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"][
        "optional-dependencies"
    ]
    [default] = re.findall(r"^ARG EXTRAS=(\S+)$", dockerfile, re.MULTILINE)
    assert set(default.split(",")) <= set(extras)
    assert json.loads(re.findall(r"^ENTRYPOINT (.+)$", dockerfile, re.MULTILINE)[0]) == ["memstore"]
    _parses(json.loads(re.findall(r"^CMD (.+)$", dockerfile, re.MULTILINE)[0]))
    assert re.search(r"^USER memstore$", dockerfile, re.MULTILINE), "the image must not run as root"


def _accepted_hosts(command: list[str]) -> list[str]:
    """The Host names ``memstore serve`` accepts with this command line, as it computes them."""
    serve = main.commands["serve"]
    params = serve.make_context("serve", command[1:]).params
    return allowed_hosts_or_fail(params["host"], params["allowed_hosts"])


def test_every_url_the_docs_give_for_the_api_is_accepted_by_it() -> None:
    """docs/operations.md gives http://127.0.0.1:8000, which the compose API answered with a 400
    (issue 30 item 11); the health check's URL and the image's default command are held to the same."""
    docs = (ROOT / "docs" / "operations.md").read_text(encoding="utf-8")
    containers = docs[docs.index("## Containers") :]
    containers = containers[: containers.index("\n## ")]
    documented = set(re.findall(r"http://([^/:`\s]+):8000", containers))
    assert {"127.0.0.1", "localhost"} <= documented
    api = _memstore_services(_compose())["api"]
    probed = set(re.findall(r"http://([^/:'\s]+):8000", json.dumps(api["healthcheck"])))
    dockerfile = (ROOT / "Dockerfile").read_text(encoding="utf-8")
    default = json.loads(re.findall(r"^CMD (.+)$", dockerfile, re.MULTILINE)[0])
    for command, hosts in ((api["command"], documented | probed), (default, {"localhost", "127.0.0.1"})):
        app = create_app(fixed_user("alice"), allowed_hosts=_accepted_hosts(command), max_body_bytes=1024)
        for host in sorted(hosts):
            answer = TestClient(app, base_url=f"http://{host}:8000").get("/healthz")
            assert answer.status_code == 200, (host, answer.text)
        assert TestClient(app, base_url="http://rebound.example:8000").get("/healthz").status_code == 400
