#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright (c) devin.outposts contributors
# MIT License (see https://opensource.org/licenses/MIT)
# SPDX-License-Identifier: MIT

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
module: session_info
short_description: List the Devin sessions queued on outposts
version_added: 0.1.0
description:
  - Reads the session queue (C(GET /opbeta/outposts/devins)), following every page.
  - A row at a page boundary can appear on two pages; the module keeps one entry per session id (the later,
    fresher copy).
  - Returns the final cursor, where a watch of the queue would start.
author:
  - devin.outposts maintainers (@devin-outposts)
extends_documentation_fragment:
  - devin.outposts.fleet_api
  - devin.outposts.attributes
  - devin.outposts.attributes.info_module
  - devin.outposts.attributes.action_group
options:
  outpost:
    description:
      - Only list sessions queued on this outpost, given by name or by id (C(outpost_env-...)).
      - A name is resolved through the outposts list; an unknown name is an error, and so is a value that
        cannot be an outpost name (see O(devin.outposts.outpost#module:name)).
    type: str
  phase:
    description:
      - Only list sessions in this queue phase.
    type: str
    choices: [pending, claimed]
  acceptor_id:
    description:
      - Only list sessions claimed by this acceptor (worker or orchestrator identity).
    type: str
  page_size:
    description:
      - Entries requested per page (the API's C(first)), between 1 and 200. All pages are read regardless.
    type: int
    default: 100
  cursor:
    description:
      - Start listing at this cursor (from an earlier run's RV(cursor) or a watch event) instead of at the start
        of the queue. The API returns rows at or after it.
    type: str
notes:
  - Reading the queue needs a token with the C(account.outposts.machine) scope.
seealso:
  - module: devin.outposts.outpost_info
  - name: Devin Outposts orchestration
    description: How orchestrators list, watch, claim and release sessions.
    link: https://docs.devin.ai/cloud/outposts/orchestration
"""

EXAMPLES = r"""
- name: List the pending sessions on the gpu-h200 outpost
  devin.outposts.session_info:
    outpost: gpu-h200
    phase: pending
  register: pending

- name: Show how many sessions are waiting
  ansible.builtin.debug:
    msg: "{{ pending.sessions | length }} sessions wait for a worker"

- name: Find the sessions an orchestrator still holds after a restart
  devin.outposts.session_info:
    phase: claimed
    acceptor_id: orchestrator-1
  register: held
"""

RETURN = r"""
sessions:
  description: The queue entries, one per session id, in the API's order.
  returned: always
  type: list
  elements: dict
  contains:
    metadata:
      description: V(session_id), V(outpost_id), V(created_at) and V(updated_at) (Unix seconds).
      type: dict
      returned: success
    spec:
      description: V(kind) (V(new) or V(resume)), V(platform), V(remote_binary_sha) and, when set, V(network_policy).
      type: dict
      returned: success
    status:
      description: V(phase), V(acceptor_id), V(claim_deadline) and V(session_status).
      type: dict
      returned: success
  sample:
    - metadata: {session_id: devin-5a1b, outpost_id: outpost_env-3f2a, created_at: 1781050000, updated_at: 1781050000}
      spec: {kind: new, platform: linux, remote_binary_sha: null}
      status: {phase: pending, acceptor_id: null, claim_deadline: null, session_status: pending}
cursor:
  description: The cursor of the last page, where a watch of the queue should start. Opaque.
  returned: always
  type: str
  sample: djE6MTc4MTA1MDAwMC4w
outpost_id:
  description: The id that O(outpost) resolved to; V(null) when O(outpost) was not given.
  returned: always
  type: str
  sample: outpost_env-3f2a
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.devin.outposts.plugins.module_utils._fleet_api import (
    MAX_PAGE_SIZE,
    PHASES,
    fleet_argument_spec,
    looks_like_outpost_id,
    outpost_id_of,
    outpost_ref_error,
    run_module,
)


def main():
    module = AnsibleModule(
        argument_spec=fleet_argument_spec(
            outpost=dict(type="str"),
            phase=dict(type="str", choices=list(PHASES)),
            acceptor_id=dict(type="str"),
            page_size=dict(type="int", default=100),
            cursor=dict(type="str", no_log=False),
        ),
        supports_check_mode=True,
    )
    params = module.params
    error = params["outpost"] is not None and outpost_ref_error("outpost", params["outpost"])
    if error:
        module.fail_json(msg=error)
    if not 1 <= params["page_size"] <= MAX_PAGE_SIZE:
        module.fail_json(msg="page_size must be between 1 and {0}, got {1}".format(MAX_PAGE_SIZE, params["page_size"]))

    def read(client):
        outpost_id = params["outpost"]
        if outpost_id and not looks_like_outpost_id(outpost_id):
            outpost_id = outpost_id_of(client.resolve_outpost(outpost_id))
        sessions, cursor = client.list_sessions(
            outpost_id=outpost_id,
            phase=params["phase"],
            acceptor_id=params["acceptor_id"],
            page_size=params["page_size"],
            cursor=params["cursor"],
        )
        return dict(changed=False, sessions=sessions, cursor=cursor, outpost_id=outpost_id)

    run_module(module, read)


if __name__ == "__main__":
    main()
