"""The gateway: an OpenAI-compatible FastAPI app that records every agent call as a pool step.

``create_app(pool, backend, settings)`` builds the app; ``GatewaySettings`` configures it;
``KeySigner`` issues / verifies episode api keys. See docs/gateway.md for the API tour.
"""

from swarm.gateway.app import create_app
from swarm.gateway.auth import KeySigner
from swarm.gateway.settings import GatewaySettings

__all__ = ["create_app", "GatewaySettings", "KeySigner"]
