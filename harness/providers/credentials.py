"""Keeping a credential out of everything an exchange carries.

A credential is checked before it is sent (printable ASCII, at least 8
characters: a shorter one could not be scrubbed without mangling evidence),
placed in its header at send time by the transport, and its exact value, in
any letter case, is scrubbed from every string that comes back.
"""

from __future__ import annotations

import dataclasses
import json
import re
from typing import Any, Final

from harness.errors import Code, ProviderRefusal
from harness.providers.base import ParsedResponse

__all__ = ["MIN_CREDENTIAL", "REDACTED", "check_credential", "redact_raw", "scrub", "scrub_parsed"]

REDACTED: Final = "[credential redacted]"
MIN_CREDENTIAL: Final = 8


def check_credential(credential: str | None) -> None:
    """Refuse (`credential_malformed`) a credential that cannot be sent or scrubbed; never echo it."""
    if credential is None:
        return
    if not isinstance(credential, str) or len(credential) < MIN_CREDENTIAL:
        raise ProviderRefusal(Code.CREDENTIAL_MALFORMED, f"the credential is not a string of {MIN_CREDENTIAL}+ characters")
    if not all("!" <= c <= "~" for c in credential):
        raise ProviderRefusal(Code.CREDENTIAL_MALFORMED, "the credential has spaces, control or non-ASCII characters")


def scrub(text: str | None, secret: str | None) -> str | None:
    """`text` without the secret, in any letter case (an upstream may upper- or lower-case it)."""
    if text is None or not secret:
        return text
    return re.sub(re.escape(secret), REDACTED, text, flags=re.IGNORECASE)


def _scrub_json(value: Any, secret: str) -> Any:
    if isinstance(value, str):
        return scrub(value, secret)
    if isinstance(value, list):
        return [_scrub_json(v, secret) for v in value]
    if isinstance(value, dict):
        return {scrub(k, secret): _scrub_json(v, secret) for k, v in value.items()}
    return value


def redact_raw(raw: bytes, secret: str | None) -> tuple[bytes, bool]:
    """The body without the secret: replaced where it appears literally; a JSON body that
    spells it with `\\u` escapes is written again (as ASCII JSON) with it scrubbed."""
    if not secret:
        return raw, False
    redacted = False
    if secret.lower().encode() in raw.lower():
        raw = re.sub(re.escape(secret.encode()), REDACTED.encode(), raw, flags=re.IGNORECASE)
        redacted = True
    if b"\\u" in raw:  # only an escaped spelling can still hide it
        try:
            value = json.loads(raw)
        except (ValueError, RecursionError):
            return raw, redacted
        text = json.dumps(value, ensure_ascii=False)
        if re.search(re.escape(secret), text, flags=re.IGNORECASE):
            return json.dumps(_scrub_json(value, secret)).encode(), True
    return raw, redacted


def scrub_parsed(parsed: ParsedResponse, secret: str | None) -> ParsedResponse:
    """`parsed` with the secret scrubbed from every string field (a JSON escape may have hidden it)."""
    if not secret:
        return parsed
    return dataclasses.replace(
        parsed,
        text=scrub(parsed.text, secret),
        finish_reason=scrub(parsed.finish_reason, secret),
        model_snapshot=scrub(parsed.model_snapshot, secret),
        request_id=scrub(parsed.request_id, secret),
        error_message=scrub(parsed.error_message, secret),
    )
