"""Every Hub request eaglekit makes has a timeout: a server that accepts and never answers cannot hang a run.

huggingface_hub builds its shared HTTP client with `timeout=None`; `bounded_hub_client()` installs a client
factory whose clients give up after EAGLEKIT_HUB_TIMEOUT seconds (default 60) of silence on any read, write
or connect. The client's own retries and backoff stay as they are.

An endpoint may carry credentials (`https://user:password@host`, from --endpoint or HF_ENDPOINT): every URL
eaglekit prints or returns goes through `without_credentials` first.
"""

from __future__ import annotations

import os
import re

DEFAULT_TIMEOUT_S = 60.0
_USERINFO = re.compile(r"(?<=://)[^\s/?#@]*@")


def without_credentials(text: str) -> str:
    """`text` (a URL, or a message that quotes URLs) with the `user:password@` of every URL in it removed."""
    return _USERINFO.sub("", text)


def hub_timeout() -> float:
    try:
        value = float(os.environ.get("EAGLEKIT_HUB_TIMEOUT", DEFAULT_TIMEOUT_S))
    except ValueError:
        return DEFAULT_TIMEOUT_S
    return value if value > 0 else DEFAULT_TIMEOUT_S


def bounded_hub_client() -> None:
    """Make huggingface_hub's shared client (re)built with timeouts; call before the first Hub request."""
    from huggingface_hub import set_client_factory
    from huggingface_hub.utils._http import default_client_factory

    seconds = hub_timeout()

    def factory():
        client = default_client_factory()
        client.timeout = seconds
        return client

    set_client_factory(factory)
