"""The simulated fleet API over HTTP: the Starlette app, its routes and the uvicorn server.

:func:`~devin_outposts_sim.http.app.create_app` builds the app around a
:class:`~devin_outposts_sim.state.store.Store`; :mod:`~devin_outposts_sim.http.server` serves it. Routes
parse and check requests (:mod:`~devin_outposts_sim.http.validate`, :mod:`~devin_outposts_sim.http.auth`)
and leave every rule of the contract to the state (:mod:`devin_outposts_sim.state`), which never imports
this package.

Importing this package imports nothing; its modules import Starlette (and ``server`` uvicorn).
"""
