# -*- coding: utf-8 -*-
# Copyright (c) devin.outposts contributors
# MIT License (see https://opensource.org/licenses/MIT)
# SPDX-License-Identifier: MIT

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
name: outpost_id
short_description: Look up the id of a Devin outpost by its name
version_added: 0.1.0
description:
  - Returns the id (C(outpost_env-...)) of each outpost named in the terms, for example to configure workers
    or orchestrators with it.
  - Reads the outposts list once per call, whatever the number of terms. A term that is already an existing
    outpost's id is returned unchanged.
author:
  - devin.outposts maintainers (@devin-outposts)
extends_documentation_fragment:
  - devin.outposts.fleet_api
  - devin.outposts.fleet_api.plugins
options:
  _terms:
    description:
      - Names of outposts (an existing outpost's id is accepted too).
      - A term that cannot be an outpost name (see O(devin.outposts.outpost#module:name)) fails the lookup
        before any request.
    type: list
    elements: str
    required: true
  on_missing:
    description:
      - What to do when no outpost has a given name.
      - V(error) fails the task with a message naming the outpost.
      - V(warn) shows a warning and leaves the term out of the result.
      - V(skip) silently leaves the term out of the result.
    type: str
    choices: [error, warn, skip]
    default: error
notes:
  - Runs on the controller. The list may be read with a token that has only the C(account.outposts.machine) scope.
seealso:
  - module: devin.outposts.outpost_info
  - module: devin.outposts.outpost
"""

EXAMPLES = r"""
- name: Start a worker on the gpu-h200 outpost
  ansible.builtin.debug:
    msg: "devin worker start --outpost={{ lookup('devin.outposts.outpost_id', 'gpu-h200') }}"

- name: Several at once, ignoring outposts that do not exist (yet)
  ansible.builtin.set_fact:
    outpost_ids: "{{ query('devin.outposts.outpost_id', 'gpu-h200', 'rhel', on_missing='skip') }}"

- name: With explicit connection options
  ansible.builtin.set_fact:
    gpu_outpost_id: >-
      {{ lookup('devin.outposts.outpost_id', 'gpu-h200',
                api_url='https://devin.example.internal', token=devin_machine_token, ca_path='/etc/ssl/corp-ca.pem') }}
"""

RETURN = r"""
_raw:
  description: The outpost ids, in the order of the terms.
  type: list
  elements: str
  sample: [outpost_env-3f2a]
"""

from ansible.errors import AnsibleError
from ansible.module_utils.common.text.converters import to_native
from ansible.plugins.lookup import LookupBase
from ansible.utils.display import Display

from ansible_collections.devin.outposts.plugins.module_utils._fleet_api import (
    FleetAPIError,
    FleetClient,
    outpost_id_of,
    outpost_name_of,
    outpost_ref_error,
)

display = Display()


class LookupModule(LookupBase):

    def run(self, terms, variables=None, **kwargs):
        self.set_options(var_options=variables, direct=kwargs)
        on_missing = self.get_option("on_missing")
        for term in terms:  # before any request: a list or a number is not a name
            error = outpost_ref_error("outpost_id", term)
            if error:
                raise AnsibleError(error)
        try:
            client = FleetClient(
                api_url=self.get_option("api_url"),
                token=self.get_option("token"),
                validate_certs=self.get_option("validate_certs"),
                ca_path=self.get_option("ca_path"),
                timeout=self.get_option("timeout"),
            )
            outposts = client.list_outposts()
        except FleetAPIError as exc:
            raise AnsibleError(to_native(exc))

        by_name = dict((outpost_name_of(o), outpost_id_of(o)) for o in outposts)
        known_ids = set(by_name.values())
        result = []
        for term in terms:
            term = to_native(term)
            if term in by_name:
                result.append(by_name[term])
            elif term in known_ids:
                result.append(term)
            elif on_missing == "error":
                raise AnsibleError("Could not find outpost {0}: no outpost with this name exists in the account "
                                   "at {1}".format(term, client.api_url))
            elif on_missing == "warn":
                display.warning("No outpost named {0} exists in the account at {1}".format(term, client.api_url))
        return result
