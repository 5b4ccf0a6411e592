"""The gateway: OpenAI-compatible routes that record every agent call as a pool step.

Its routers are assembled into an app by :func:`swarm.app.create_app`; ``GatewaySettings`` configures it;
``KeySigner`` issues / verifies episode api keys. See docs/gateway.md for the API tour.
"""

from swarm.web.auth import KeySigner
from swarm.web.settings import GatewaySettings

__all__ = ["GatewaySettings", "KeySigner"]
