"""Orchestrator drivers: one small class per kind of machine, behind :class:`~.base.Driver`.

Drivers are looked up by name and imported only when chosen, so ``--driver process`` never loads the
Kubernetes client. The modules:

* :mod:`.base`: the interface, the values that cross it, and the option table (:class:`~.base.OptionTable`
  of :class:`~.base.DriverOption` rows) in which every driver declares its options once;
* :mod:`.process`: a local process per session (:mod:`.process_status`: how its workers' ends are
  awaited, and its status source);
* :mod:`.podman`, :mod:`.kubernetes`, :mod:`.ansible`: one package per driver, each with ``driver.py``
  (the class) and ``options.py`` (its option table), the rest named for what it holds.
"""

from __future__ import annotations

import importlib

from devin_outposts.orchestrator.drivers.base import Driver, DriverError

#: ``--driver`` name -> "module:class".
DRIVERS = {
    "process": "devin_outposts.orchestrator.drivers.process:ProcessDriver",
    "podman": "devin_outposts.orchestrator.drivers.podman:PodmanDriver",
    "kubernetes": "devin_outposts.orchestrator.drivers.kubernetes:KubernetesDriver",
    "ansible": "devin_outposts.orchestrator.drivers.ansible:AnsibleDriver",
}


def driver_class(name: str) -> type[Driver]:
    try:
        module_name, class_name = DRIVERS[name].split(":")
    except KeyError:
        raise DriverError(f"unknown driver {name!r}; choose one of {', '.join(DRIVERS)}") from None
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise DriverError(f"the {name} driver cannot be loaded: {exc}") from exc
    cls: type[Driver] = getattr(module, class_name)
    return cls
