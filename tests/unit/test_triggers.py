"""A trigger's pure parts: the signature checks of both sources, the template formatter (no
attribute, conversion or format spec; values inserted, never expanded; bounded), the filter
and the spec's checks."""

from __future__ import annotations

import hashlib
import hmac
from datetime import UTC, datetime, timedelta

import pytest
from standardwebhooks.webhooks import Webhook

from worker.errors import InvalidInput
from worker.triggers import signatures
from worker.triggers.signatures import BadSignature, check_secret, new_secret, verify
from worker.triggers.spec import Filter, parse_spec
from worker.triggers.template import (
    TEXT_MAX_CHARS,
    VALUE_MAX_CHARS,
    check_template,
    label_value,
    render,
)

BODY = b'{"action":"labeled"}'


def github_headers(secret: str, body: bytes) -> dict[str, str]:
    digest = hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()
    return {"X-Hub-Signature-256": f"sha256={digest}", "X-GitHub-Delivery": "d-1"}


def test_a_github_signature_verifies_the_raw_body_only() -> None:
    secret = new_secret("github")
    verify("github", secret, github_headers(secret, BODY), BODY)
    with pytest.raises(BadSignature, match="does not match"):
        verify("github", secret, github_headers(secret, BODY), BODY + b" ")
    with pytest.raises(BadSignature, match="does not match"):
        verify("github", secret, github_headers("another-secret-entirely", BODY), BODY)
    with pytest.raises(BadSignature, match="no X-Hub-Signature-256"):
        verify("github", secret, {}, BODY)
    sha1 = {"X-Hub-Signature": "sha1=" + hmac.new(secret.encode(), BODY, "sha1").hexdigest()}
    with pytest.raises(BadSignature):
        verify("github", secret, sha1, BODY)


def test_a_standard_webhooks_signature_and_its_timestamp() -> None:
    secret = new_secret("webhook")
    signer = Webhook(secret)

    def headers(at: datetime, msg_id: str = "msg_1") -> dict[str, str]:
        return {
            "webhook-id": msg_id,
            "webhook-timestamp": str(int(at.timestamp())),
            "webhook-signature": signer.sign(msg_id, at, BODY),
        }

    now = datetime.now(UTC)
    verify("webhook", secret, headers(now), BODY)
    with pytest.raises(BadSignature, match="too old"):
        verify("webhook", secret, headers(now - timedelta(minutes=10)), BODY)
    with pytest.raises(BadSignature, match="too new"):
        verify("webhook", secret, headers(now + timedelta(minutes=10)), BODY)
    tampered = {**headers(now), "webhook-id": "msg_2"}  # the id is signed too
    with pytest.raises(BadSignature, match="no matching signature"):
        verify("webhook", secret, tampered, BODY)
    with pytest.raises(BadSignature, match="missing"):
        verify("webhook", secret, {}, BODY)


def test_delivery_ids() -> None:
    assert signatures.delivery_id("github", {"X-GitHub-Delivery": "abc"}, BODY) == "abc"
    assert signatures.delivery_id("webhook", {"webhook-id": "msg_9"}, BODY) == "msg_9"
    anonymous = signatures.delivery_id("github", {}, BODY)
    assert anonymous == "sha256:" + hashlib.sha256(BODY).hexdigest()
    assert len(signatures.delivery_id("github", {"X-GitHub-Delivery": "x" * 999}, BODY)) == 200


def test_secrets_are_checked_without_being_shown() -> None:
    with pytest.raises(InvalidInput) as short:
        check_secret("github", "tiny-secret")
    assert "tiny-secret" not in str(short.value)
    with pytest.raises(InvalidInput, match="whsec_"):
        check_secret("webhook", "not base64 at all, but long enough")
    assert check_secret("webhook", new_secret("webhook")).startswith("whsec_")
    assert check_secret("github", "a" * 20) == "a" * 20


PAYLOAD = {
    "issue": {"title": "Crash {issue.body} {__class__}", "body": "Steps", "number": 7},
    "flag": True,
    "nested": {"list": [1, 2], "none": None},
}


@pytest.mark.parametrize(
    ("template", "rendered"),
    [
        ("{issue.title}", "Crash {issue.body} {__class__}"),  # inserted, never expanded
        ("#{issue.number}: {issue.body}", "#7: Steps"),
        ("{flag} {nested.none} {nested.list} {missing.key}", "true   "),
        ("{{issue.title}}", "{issue.title}"),
        ("{issue}", ""),  # an object renders as nothing
        ("{0}", ""),  # a key like any other (no positional argument: there are none)
    ],
)
def test_render(template: str, rendered: str) -> None:
    assert render(check_template(template), PAYLOAD) == rendered


@pytest.mark.parametrize(
    "template",
    [
        "{__class__}",
        "{issue.__dict__}",
        "{issue._private}",
        "{issue.title!r}",
        "{issue.title:>99999}",
        "{issue[title]}",
        "{0.__class__}",
        "{}",
        "{issue..title}",
        "{ issue.title }",
        "unbalanced {",
        "unbalanced }",
        "{a.b.c.d.e.f.g.h.i}",
    ],
)
def test_what_is_no_placeholder_is_refused(template: str) -> None:
    with pytest.raises(InvalidInput, match="no placeholder"):
        check_template(template)


def test_an_unchecked_template_renders_tricks_as_written() -> None:
    assert render("{issue.__class__} {issue.title!r}", PAYLOAD) == (
        "{issue.__class__} {issue.title!r}"
    )


def test_render_is_bounded() -> None:
    huge = {"a": "x" * (VALUE_MAX_CHARS * 2)}
    assert len(render("{a}", huge)) == VALUE_MAX_CHARS
    assert len(render("{a}" * 20, huge)) == TEXT_MAX_CHARS


def test_label_values_are_what_a_label_holds() -> None:
    assert label_value("acme/app") == "acme/app"
    assert label_value("fix it; rm -rf /\x1b[31m") == "fix-it-rm--rf-/-31m"
    assert len(label_value("y" * 500)) == 200


def test_the_filter() -> None:
    labelled = Filter(event="issues", action="labeled", label="agent")
    payload = {"action": "labeled", "label": {"name": "agent"}}
    assert labelled.refuses("issues", payload) is None
    assert "event" in str(labelled.refuses("push", payload))
    assert "action" in str(labelled.refuses("issues", {**payload, "action": "opened"}))
    assert "label" in str(labelled.refuses("issues", {**payload, "label": {"name": "bug"}}))
    assert "label" in str(labelled.refuses("issues", {**payload, "label": "agent"}))
    command = Filter(event="issue_comment", starts_with="/agent")
    assert command.refuses("issue_comment", {"comment": {"body": "/agent fix it"}}) is None
    assert command.refuses("issue_comment", {"comment": {"body": "please /agent"}}) is not None
    assert command.refuses("issue_comment", {"comment": {"body": 3}}) is not None
    assert Filter().refuses("anything", {}) is None


def test_the_spec_refuses_what_a_trigger_cannot_take() -> None:
    fields = {"name": "t", "source": "github", "harness": "stdio-json", "input_template": "x"}
    assert parse_spec(**fields).name == "t"
    for bad, why in (
        ({"name": "Has Space"}, "name"),
        ({"source": "gitlab"}, "source"),
        ({"label_templates": {"trigger": "x"}}, "trigger"),
        ({"label_templates": {"k": "{__class__}"}}, "no placeholder"),
        ({"run": {"producer": "x"}}, "producer"),
        ({"run": {"max_turns": -1}}, "max_turns"),
        ({"run": {"repo": "https://x/y.git"}, "repo_from_payload": True}, "not both"),
    ):
        with pytest.raises(InvalidInput, match=why):
            parse_spec(**{**fields, **bad})
