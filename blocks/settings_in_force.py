"""The settings in force: the one resolution every command, flow and check calls.

A `FLEET_*` variable set in the environment wins; else the value of a registered Prefect
block (`blocks.fleet_blocks`); else the default. Blocks are read from the Prefect API that
PREFECT_API_URL names (the environment, or the active Prefect profile); with none, from
nowhere: a run on a temporary local API reads none either, so `run`, `doctor` and
`batches list` always name the same databases. Where a variable overrules a block holding
another value, that is said once per process, on one line.
"""

from __future__ import annotations

import os
import sys
import tomllib
from collections.abc import Callable, Mapping
from pathlib import Path

from fleet_import.checks.settings import SettingProblem, read_settings
from fleet_import.config import ResolvedSettings, masked_url, resolve_settings

_said: set[str] = set()
_PROBE_SECONDS = 3.0


def prefect_api_url(env: Mapping[str, str] | None = None) -> str | None:
    """PREFECT_API_URL from the environment or the active profile, read without importing
    Prefect (seconds) when it is not loaded yet: a configuration error stays instant."""
    env = os.environ if env is None else env
    if env.get("PREFECT_API_URL"):
        return env["PREFECT_API_URL"]
    if "prefect.settings" in sys.modules:
        from prefect.settings import PREFECT_API_URL

        return PREFECT_API_URL.value() or None
    return _profile_api_url(env)


def _profile_api_url(env: Mapping[str, str]) -> str | None:
    home = Path(env.get("PREFECT_HOME") or Path.home() / ".prefect").expanduser()
    path = Path(env.get("PREFECT_PROFILES_PATH") or home / "profiles.toml").expanduser()
    try:
        profiles = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError):
        return None
    active = env.get("PREFECT_PROFILE") or profiles.get("active") or "ephemeral"
    value = profiles.get("profiles", {}).get(active, {}).get("PREFECT_API_URL")
    return str(value) if value else None


def settings_in_force(
    env: Mapping[str, str] | None = None,
    tell: Callable[[str], None] | None = None,
    *,
    say_unread: bool = True,
) -> tuple[ResolvedSettings, list[SettingProblem]]:
    """The settings every command and flow runs on, their sources, and the problems of the
    environment's values (a refused value falls back to its default, so the rest is still
    checked). Says once when a variable overrules a block, and (unless `say_unread` is
    false: a command about to fail on that API itself) when the API does not answer, so no
    block was read: through `tell` (a command's stderr), else into the flow run's log."""
    env = os.environ if env is None else env
    from_env, problems = read_settings()
    stored = {}
    api_url = prefect_api_url(env)
    if api_url and not api_url.startswith(("http://", "https://")):
        pass  # not a URL: the settings check says so
    elif api_url and _answers(api_url):
        from blocks.fleet_blocks import stored_settings

        stored = stored_settings()
    elif api_url and say_unread:
        _say_once(
            f"the Prefect API at {masked_url(api_url)} does not answer: no Prefect "
            "block was read, the settings are the environment's and the defaults",
            tell,
        )
    resolved = resolve_settings(from_env, stored, env)
    say_overruled(resolved, tell)
    return resolved, problems


def _answers(api_url: str) -> bool:
    """Whether the Prefect API answers its health check within a few seconds: a dead API
    would hold every command in the Prefect client's retries for minutes."""
    import httpx

    try:
        httpx.get(api_url.rstrip("/") + "/health", timeout=_PROBE_SECONDS).raise_for_status()
    except httpx.HTTPError:
        return False
    return True


def say_overruled(resolved: ResolvedSettings, tell: Callable[[str], None] | None = None) -> None:
    """The overruled line, once per process: a command that runs its flow in this process
    resolves twice, and says it once."""
    line = resolved.overruled_line()
    if line:
        _say_once(line, tell)


def _say_once(line: str, tell: Callable[[str], None] | None) -> None:
    if line in _said:
        return
    _said.add(line)
    if tell is not None:
        tell(line)
        return
    from blocks.fleet_blocks import warn_in_run

    warn_in_run("%s", line)
