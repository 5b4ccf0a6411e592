"""The example tool environment's tool server: ``lookup(key)`` returns the code word filed under a key.

A verifiers ``Toolset`` (an MCP server): verifiers starts it as ``python -m experiments.verifiers.lookup_tools``
on 127.0.0.1 (taskset-scoped, so once per serving environment) and the harness reaches it with an MCP
client. ``key`` is typed as a ``Literal`` of the table's keys, so the tool's JSON schema carries an
``enum`` and the gateway's constrained decoding can only write a valid key. It knows nothing of the task
or the rubric (:mod:`experiments.verifiers.lookup_env`).
"""

# no `from __future__ import annotations`: the MCP server builds the tool's schema from the evaluated hints
from typing import Literal

import verifiers.v1 as vf

__all__ = ["CODES", "LookupTools"]

CODES = {"red": "apple", "blue": "river", "green": "forest", "gold": "candle",
         "grey": "stone", "pink": "lemon", "black": "piano", "white": "cloud"}
Key = Literal["red", "blue", "green", "gold", "grey", "pink", "black", "white"]


class LookupTools(vf.Toolset[vf.SharedToolsetConfig]):
    """One tool, ``lookup``, advertised without a server prefix."""

    TOOL_PREFIX = None

    @vf.tool
    async def lookup(self, key: Key) -> str:
        """The code word filed under key."""
        return CODES[key]


if __name__ == "__main__":
    LookupTools.run()
