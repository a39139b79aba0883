"""The one check of a URL a user gives (--endpoint, HF_ENDPOINT, bench --base-url): its value may hold
credentials, so a refusal names the option, never the value; and the one way a URL's credentials are removed from
text that is printed or returned (imported by every report, so it imports no HTTP client)."""

from __future__ import annotations

import re
from urllib.parse import urlsplit

from eaglekit.errors import UsageError

# userinfo: everything up to the LAST '@' of the authority (a password may hold '@'), as urllib splits it
_USERINFO = re.compile(r"(?<=://)[^\s/?#]*@")


def without_credentials(text: str) -> str:
    """`text` (a URL, or a message that quotes URLs) with the `user:password@` of every URL in it removed."""
    return _USERINFO.sub("", text)


def check_http_url(url: str, option: str, example: str) -> str:
    """`url` without a trailing slash if it is an http(s) URL with a host, a valid port and no query or fragment
    (routes are appended to it); else a UsageError naming `option` and showing `example`."""
    try:
        parts = urlsplit(url)
        valid = (parts.scheme in ("http", "https") and bool(parts.hostname) and not parts.query
                 and not parts.fragment and "?" not in url and "#" not in url
                 and not any(c.isspace() for c in url) and (parts.port is None or parts.port > 0))
    except ValueError:
        valid = False
    if not valid:
        raise UsageError(f"{option} must be an http(s) URL with a host and no query or fragment, like {example} "
                         "(the value is not shown: it may hold credentials)")
    return url.rstrip("/")
