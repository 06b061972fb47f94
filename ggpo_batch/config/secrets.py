"""Secrets kept out of every output: the passwords and tokens this process was configured with,
remembered in the forms output writes them in, and `redact`, which hides them and the password of
every URL in a text. Apart from the settings, which remember what they read.
"""

from __future__ import annotations

# Passwords of the URLs this process was configured with (raw and percent-decoded) and the dashboard's
# token, in the forms output writes them in (as JSON, CSV and HTML escape them): hidden by `redact`
# wherever they appear, even outside a URL. Shorter ones would blank out ordinary words.
_PASSWORDS: set[str] = set()
_MIN_REMEMBERED = 4
def remember(secret: str) -> None:
    import html
    import json

    if len(secret) < _MIN_REMEMBERED:
        return
    _PASSWORDS.update({secret, json.dumps(secret)[1:-1], json.dumps(secret, ensure_ascii=False)[1:-1],
                       secret.replace('"', '""'), html.escape(secret)})


def remember_secret(value: str) -> None:
    """Hide `value` (a password, a token) wherever `redact` sees it from now on."""
    remember(value)


def remember_password(url: str) -> None:
    from urllib.parse import unquote

    from ..common.limits import url_userinfo

    userinfo = url_userinfo(url)
    if userinfo is None or ":" not in userinfo:
        return
    password = userinfo.split(":", 1)[1]
    for p in (password, unquote(password)):
        remember(p)


def _redact_url(url: str) -> str:
    """One URL with the password of its `user:password@` part replaced by ***. The userinfo ends at
    the last '@' (RFC 3986; urllib and redis-py read it so), so a raw '@', ':' or any other reserved
    character in a password is hidden whole; an '@' later in the text only hides more, never less."""
    scheme, _sep, rest = url.partition("://")
    if rest.startswith("/"):
        return url
    at = rest.rfind("@")
    if at < 0:
        return url
    user, colon, _password = rest[:at].partition(":")
    if not colon:
        return url
    return f"{scheme}://{user}:***@{rest[at + 1:]}"


def _scheme_start(text: str, sep: int) -> int:
    """Where the scheme of the `://` at `sep` starts (RFC 3986: a letter, then letters, digits, + - .)."""
    i = sep
    while i > 0 and (text[i - 1].isascii() and (text[i - 1].isalnum() or text[i - 1] in "+-.")):
        i -= 1
    while i < sep and not text[i].isalpha():
        i += 1
    return i


def redact(text: str) -> str:
    """`text` with the password of every URL in it, and every configured password, replaced by ***.

    Each URL is found by its `://` and runs to the next whitespace (a password may not hold raw
    whitespace: `limits.url_problem`); its password is cut out by `_redact_url`, not by a pattern."""
    out: list[str] = []
    pos = 0
    while True:
        sep = text.find("://", pos)
        if sep < 0:
            out.append(text[pos:])
            break
        start = max(_scheme_start(text, sep), pos)
        end = sep + 3
        while end < len(text) and not text[end].isspace():
            end += 1
        if start == sep:  # no scheme: not a URL
            out.append(text[pos:end])
        else:
            out.append(text[pos:start] + _redact_url(text[start:end]))
        pos = end
    result = "".join(out)
    for password in sorted(_PASSWORDS, key=len, reverse=True):
        result = result.replace(password, "***")
    return result
