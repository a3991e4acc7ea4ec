"""Test helpers: run the fleet simulator in-process or as a subprocess.

In-process (fast; one background thread; state in ``:memory:`` unless ``db`` is given)::

    from devin_outposts_sim.testing import run_sim

    with run_sim(claim_ttl=1, watch_max_duration=2, keepalive_interval=0.2, sweep_interval=0.05) as sim:
        sim.url                                   # "http://127.0.0.1:<port>", the fleet API base URL
        token = sim.create_token("orchestrator")  # or "machine"; account="acct-other" for isolation
        outpost = sim.admin.create_outpost("rhel", "linux")
        entry = sim.admin.enqueue(outpost.outpost_id)
        sim.admin.claims(session_id=entry.session_id)  # the claim history
        sim.store.gateway.check_connect_token(entry.session_id, "...")  # direct access to the state
        sim.runtime.notifier.open_streams         # how many watch streams are open right now

As a subprocess (``python -m devin_outposts_sim serve``), for restart and kill tests on one database::

    from devin_outposts_sim.testing import sim_process

    with sim_process(tmp_path / "sim.db", claim_ttl=2) as proc:
        token = proc.create_token("machine")
        proc.restart()             # SIGTERM, then start again on the same database and port
        proc.kill(); proc.start()  # SIGKILL: no graceful shutdown
        proc.url, proc.admin, proc.log_path

Both handles offer ``url``, ``static_base_url`` (the ``devin-remote`` distribution), ``admin``
(:class:`~devin_outposts_sim.admin_client.SimAdmin`), ``admin_token`` and
``create_token(scope, account=...)``. The keyword arguments of both are the
:class:`~devin_outposts_sim.http.config.SimConfig` fields: ``claim_ttl``, ``watch_max_duration``,
``keepalive_interval``, ``sweep_interval``, ``gateway_url``, ``status_lag`` (seconds; fractions allowed).

The stand-in ``devin-remote`` without a worker (a claim response gives the gateway URL and the connect
token); see :mod:`~devin_outposts_sim.testing.remote`::

    with standin_process(workdir, claimed, state_dir=tmp_path / "state") as remote:
        sim.admin.add_calls(sid, [tools.run("echo hi")])
        sim.admin.wait_calls(sid)
        sim.admin.end_session(sid)
        assert remote.wait(10) == 0
"""

from __future__ import annotations

from devin_outposts_sim.state.db import token_fingerprint
from devin_outposts_sim.testing.remote import StandinProcess, claim_session, standin_env, standin_process
from devin_outposts_sim.testing.simulator import SimHandle, SimProcess, run_sim, sim_process, wait_until

__all__ = [
    "SimHandle",
    "SimProcess",
    "StandinProcess",
    "claim_session",
    "run_sim",
    "sim_process",
    "standin_env",
    "standin_process",
    "token_fingerprint",
    "wait_until",
]
