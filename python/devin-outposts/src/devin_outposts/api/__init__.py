"""The async client of the Devin Outposts fleet API (docs/fleet-api.md §2-§4), with its wire models and
errors. It imports nothing else of ours: the worker, the simulator and the command line build on it.

* :mod:`.client`: :class:`~.client.FleetClient` (retries, pagination, the SSE watch, error mapping);
* :mod:`.transport`: what every request shares (the API URL rule, ids as path segments, TLS, the reply read
  within its limit, ``Retry-After``, the page-size rule);
* :mod:`.models`: the pydantic models of queue entries, outposts and the default platform;
* :mod:`.errors`: the exceptions, one per kind of answer (auth, not found, conflict, ...);
* :mod:`.limits`: the size limits every reply is read within;
* :mod:`.inflate`: the one decoder of a reply's ``Content-Encoding``, a piece at a time, so that a compressed
  reply is capped before it is decompressed;
* :mod:`.deadlines`: the total deadline of each request, the watch's idle deadline, and the cut a stopping
  program puts on every request;
* :mod:`.stream`: the one reader of the watch stream (SSE framing, its caps, keepalives, where to resume),
  bytes in and events out; the simulator's pytest plugin and the event source read streams with it too;
* :mod:`.backoff`: the one backoff (a random wait between half and all of ``min(cap, base * 2**n)``);
* :mod:`.listwatch`: list, then watch, without I/O: paging (upsert by session id, the final cursor) and the
  loop's decisions (when to list again, where to resume, when to wait and how long), which the worker's
  queue feed and the event source both follow.

:mod:`.stream`, :mod:`.backoff`, :mod:`.listwatch` and :mod:`.inflate` import only the standard library:
the collection ships byte-identical copies of them in ``plugins/plugin_utils/`` for the event source, which
runs where this package is not installed.
"""
