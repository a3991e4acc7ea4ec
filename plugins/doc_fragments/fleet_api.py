# -*- coding: utf-8 -*-
# Copyright (c) devin.outposts contributors
# MIT License (see https://opensource.org/licenses/MIT)
# SPDX-License-Identifier: MIT

from __future__ import absolute_import, division, print_function

__metaclass__ = type


class ModuleDocFragment(object):

    # Connection and authentication options shared by every module and plugin that talks to the fleet API.
    DOCUMENTATION = r"""
options:
  api_url:
    description:
      - Base URL of the Devin API. Give the base only; the collection appends C(/opbeta/outposts/...),
        C(/v3beta1/...) and C(/v3/...) itself (a trailing C(/opbeta/outposts) is tolerated and removed).
      - If not set, the value of the E(DEVIN_API_URL) environment variable is used.
    type: str
    default: https://api.devin.ai
  token:
    description:
      - A v3 API token of a service user, sent as a bearer token in the C(Authorization) header.
      - Reading outposts and the queue needs the C(account.outposts.machine) scope; creating and deleting
        outposts needs C(account.outposts.orchestrator). The organization default platform needs the
        C(ManageOrgSettings) permission on the organization.
      - If not set, the value of the E(DEVIN_OUTPOSTS_TOKEN) environment variable is used. One of the two is required.
      - The token is never logged and never appears in messages.
    type: str
  validate_certs:
    description:
      - Whether to verify the API's TLS certificate. Only set to V(false) against a test server.
    type: bool
    default: true
  ca_path:
    description:
      - Path to a PEM bundle of CA certificates to verify the API's certificate with, for example a
        corporate TLS-inspecting proxy's CA. The system trust store is used when not set.
    type: path
  timeout:
    description:
      - Seconds each HTTP request may take in all, from connecting to the last byte of the answer, and the
        longest wait for any one network read within it. A server that answers a byte at a time is given up
        at this deadline like one that does not answer.
      - Requests that fail with HTTP 429, a 5xx status, a connection error or this deadline are retried up to
        three times with exponential backoff and jitter, honouring C(Retry-After) (at most 60 seconds), each
        attempt with a deadline of its own. Creating an outpost is retried only when the server cannot have
        acted on it.
      - Proxies come from the usual E(HTTPS_PROXY), E(HTTP_PROXY) and E(NO_PROXY) environment variables.
    type: float
    default: 30
"""

    # For plugins (the lookup): the same options, also read from the environment by Ansible's config system.
    PLUGINS = r"""
options:
  api_url:
    env:
      - name: DEVIN_API_URL
  token:
    env:
      - name: DEVIN_OUTPOSTS_TOKEN
"""
