"""HTTP plumbing under both the gateway and the dashboard: settings, credentials, errors, service state, pool JSON.

:mod:`swarm.app` assembles the app from :mod:`swarm.gateway` and :mod:`swarm.dashboard`; both import from
here and neither from the other. It holds no routes and does not build an app.
"""
