"""The ``ansible`` driver: the user's playbooks make and destroy each session's machine
(docs/orchestrator-ansible.md).

* :mod:`.driver`: :class:`AnsibleDriver` (provision, start, status, teardown; no snapshots);
* :mod:`._run`: one ansible-runner run in a subprocess, its artifacts and its environment.
"""

from __future__ import annotations

from devin_outposts.orchestrator.drivers.ansible.driver import AnsibleDriver, parse_unit_state

__all__ = ["AnsibleDriver", "parse_unit_state"]
