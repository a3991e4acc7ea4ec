"""The Windows service host: one worker instance as a native Windows service (docs/windows-worker.md).

* :mod:`.service`: :func:`~.service.main` (what the role's ``service_host.py`` calls), the service class
  on pywin32's framework, and service controls turned into the worker's drain;
* :mod:`.setup`: the host's arguments, the worker's config from ``worker.env``, its log file;
* :mod:`.envfile`: the strict ``worker.env`` reader.

Nothing here needs Windows to be imported or tested: pywin32 is reached through what the tests can fake.
"""
