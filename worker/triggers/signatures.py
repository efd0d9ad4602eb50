"""How an inbound delivery proves its sender: the trigger's secret, as its source signs.

``github``: ``X-Hub-Signature-256: sha256=`` and the hex HMAC-SHA256 of the raw body, keyed
by the secret's text, compared in constant time; the delivery id is ``X-GitHub-Delivery``
(not signed by GitHub: see :func:`delivery_id`). ``webhook``: Standard Webhooks, checked by
its own library (``standardwebhooks``: ``webhook-id``, ``webhook-timestamp`` within five
minutes of now, ``webhook-signature`` over ``id.timestamp.body``, keyed by the bytes of a
``whsec_`` secret); the delivery id is the signed ``webhook-id``.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import secrets
from collections.abc import Mapping
from typing import Literal

from standardwebhooks.webhooks import Webhook, WebhookVerificationError

from worker.errors import InvalidInput

Source = Literal["github", "webhook"]
SECRET_MIN_CHARS = 16
SECRET_MAX_CHARS = 512
DELIVERY_ID_MAX_CHARS = 200


class BadSignature(Exception):
    """The delivery is not the trigger's: why, in a few words (never the secret)."""


def new_secret(source: Source) -> str:
    """A random secret in the form the source takes: hex for GitHub, ``whsec_`` and base64
    for Standard Webhooks."""
    if source == "github":
        return secrets.token_hex(32)
    return "whsec_" + base64.b64encode(secrets.token_bytes(32)).decode()


def check_secret(source: Source, secret: str) -> str:
    """``secret`` when the source can sign with it; InvalidInput (never showing it) if not."""
    if not isinstance(secret, str) or not (
        SECRET_MIN_CHARS <= len(secret) <= SECRET_MAX_CHARS and secret.isprintable()
    ):
        raise InvalidInput(
            f"a trigger's secret is {SECRET_MIN_CHARS} to {SECRET_MAX_CHARS} printable characters"
        )
    if source == "webhook":
        try:
            key = base64.b64decode(secret.removeprefix("whsec_"), validate=True)
        except (binascii.Error, ValueError):
            key = b""
        if len(key) < 16:
            raise InvalidInput(
                "a Standard Webhooks secret is 'whsec_' and the base64 of at least 16 bytes"
            )
    return secret


def _header(headers: Mapping[str, str], name: str) -> str:
    return next((v for k, v in headers.items() if k.lower() == name), "")


def verify(source: Source, secret: str, headers: Mapping[str, str], body: bytes) -> None:
    """Nothing when ``body`` and ``headers`` are signed with ``secret``; BadSignature else."""
    if source == "github":
        given = _header(headers, "x-hub-signature-256")
        if not given.startswith("sha256="):
            raise BadSignature("no X-Hub-Signature-256: sha256=... header")
        expected = "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()
        if not hmac.compare_digest(expected.encode(), given.strip().encode("utf-8", "replace")):
            raise BadSignature("the X-Hub-Signature-256 does not match the body")
        return
    wanted = ("webhook-id", "webhook-timestamp", "webhook-signature")
    try:
        Webhook(secret).verify(body, {n: _header(headers, n) for n in wanted}, json_parse=False)
    except WebhookVerificationError as exc:
        raise BadSignature(f"Standard Webhooks: {str(exc).lower()}") from None


def delivery_id(source: Source, headers: Mapping[str, str], body: bytes) -> str:
    """The source's id of this delivery (its retries keep it). GitHub does not sign its
    ``X-GitHub-Delivery``: the SHA-256 of the signed body stands beside it, so that a body
    sent again under a new id is still the same delivery."""
    name = "x-github-delivery" if source == "github" else "webhook-id"
    given = _header(headers, name)[:DELIVERY_ID_MAX_CHARS]
    if not given:
        given = "sha256:" + hashlib.sha256(body).hexdigest()
    return given


def body_digest(body: bytes) -> str:
    return hashlib.sha256(body).hexdigest()
