"""A deployment pull step that pins the code a flow run executes to the deployed version.

`prefect deploy` run with FLEET_CODE_VERSION=$(git rev-parse HEAD) stores that commit in
every deployment's pull steps; each flow run then refuses to start on a worker whose code
is another version (a checkout not yet updated, an image of another tag), instead of
running code nobody deployed. Without it at deploy time, the placeholder is resolved from
the worker's own environment and nothing is pinned.

The worker's version: FLEET_CODE_VERSION in its environment (the image bakes it in,
deployments/Dockerfile), else `git rev-parse HEAD` of the working directory (a checkout).
"""

from __future__ import annotations

import os
import subprocess

_GIT_TIMEOUT_SECONDS = 10.0


class CodeVersionMismatch(RuntimeError):
    """This worker's code is not the version the deployment pins."""


def worker_code_version(directory: str = ".") -> str | None:
    version = os.environ.get("FLEET_CODE_VERSION", "").strip()
    if version:
        return version
    try:
        result = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            cwd=directory,
            capture_output=True,
            text=True,
            timeout=_GIT_TIMEOUT_SECONDS,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if result.returncode != 0:
        return None
    return result.stdout.strip() or None


def require_code_version(expected: str | None = None) -> dict[str, str]:
    """Pull step: raise CodeVersionMismatch unless the worker runs `expected` (a commit,
    or a prefix of one). An empty or unresolved `expected` pins nothing."""
    pinned = (expected or "").strip()
    if not pinned or pinned.startswith("{{"):
        return {"code_version": worker_code_version() or "unknown"}
    actual = worker_code_version()
    if actual is None or not (actual.startswith(pinned) or pinned.startswith(actual)):
        raise CodeVersionMismatch(
            f"the deployment pins code version {pinned}, this worker runs "
            f"{actual or 'an unknown version'} in {os.getcwd()}: update the worker "
            "(git checkout / image tag) or re-deploy"
        )
    return {"code_version": actual}
