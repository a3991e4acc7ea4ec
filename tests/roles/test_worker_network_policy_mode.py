"""``devin_outposts_worker_network_policy`` reaches the bundled worker as its ``--network-policy`` option:
the role writes it to the instance's environment file (``DEVIN_WORKER_NETWORK_POLICY``, the option's
variable), and the worker's own option table reads it back, through systemd's quoting, as the mode. The
Molecule ``default`` scenario runs a confined session with the default (enforce); ``ignore`` is checked
here, without a host."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from devin_outposts.core.netpolicy.confinement import EnforcementMode
from devin_outposts.worker.options import parse_start_args

from test_worker_token_layout import TOKEN, render

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _collection_link() -> None:
    if not (ROOT / ".cache/collections/ansible_collections/devin/outposts").exists():
        pytest.fail("run through scripts/test.sh (scripts/lib.sh links the checkout into .cache/collections)")


def environment(text: str) -> dict[str, str]:
    """An environment file as systemd's EnvironmentFile= reads it (double quotes, backslash escapes)."""
    values = {}
    for line in text.splitlines():
        match = re.fullmatch(r'([A-Za-z_][A-Za-z0-9_]*)="((?:[^"\\]|\\.)*)"', line)
        if match:
            values[match.group(1)] = re.sub(r"\\(.)", r"\1", match.group(2))
    return values


@pytest.mark.parametrize(
    ("role_value", "mode"),
    [
        (None, EnforcementMode.ENFORCE),
        ("enforce", EnforcementMode.ENFORCE),
        ("ignore", EnforcementMode.IGNORE),
    ],
)
def test_the_roles_network_policy_mode_is_the_workers(
    tmp_path: Path, role_value: str | None, mode: EnforcementMode
) -> None:
    role_vars = {
        "devin_outposts_worker_token": TOKEN,
        "devin_outposts_worker_instances": [{"name": "main", "outpost": "pool"}],
    }
    if role_value is not None:
        role_vars["devin_outposts_worker_network_policy"] = role_value
    env = environment(render(tmp_path, role_vars)["main"]["env"])
    assert env["DEVIN_WORKER_NETWORK_POLICY"] == mode.value
    # The unit gives the token on standard input (DEVIN_OUTPOSTS_TOKEN_FD=0); a stand-in token here.
    config = parse_start_args(["--outpost", "pool"], environ={**env, "DEVIN_OUTPOSTS_TOKEN": "stand-in"})
    assert config.network_policy is mode
