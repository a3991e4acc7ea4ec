"""The ``ansible`` driver: the user's playbooks make and destroy each session's machine
(docs/orchestrator-ansible.md).

* :mod:`.driver`: :class:`AnsibleDriver` (provision, start, status, teardown; no snapshots);
* :mod:`.options`: its option table, with the checks of ``env`` and ``machine_prefix``;
* :mod:`.records`: its record of each machine (playbook-made hosts carry no labels to find them by);
* :mod:`.units`: the session unit on a host, its name and its state (``systemctl show``);
* :mod:`.status`: its status source, every machine's unit read by one ad-hoc run per interval;
* :mod:`._run`: one ansible-runner run in a child process, its artifacts and its environment.
"""

from __future__ import annotations

from devin_outposts.orchestrator.drivers.ansible.driver import AnsibleDriver
from devin_outposts.orchestrator.drivers.ansible.units import parse_unit_state

__all__ = ["AnsibleDriver", "parse_unit_state"]
