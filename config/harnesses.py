"""Per-harness defaults: the image each runs in and the grants a producer may ask for."""

from __future__ import annotations

from collections.abc import Iterable

#: The image with the five real CLIs (built by ``scripts/build-images``) and the demo image.
CLI_IMAGE = "harness-worker/clis:1"
DEMO_IMAGE = "harness-worker/demo:1"

DEFAULT_IMAGES: dict[str, str] = {
    "claude-code": CLI_IMAGE,
    "codex": CLI_IMAGE,
    "gemini": CLI_IMAGE,
    "opencode": CLI_IMAGE,
    "pi": CLI_IMAGE,
    "stdio-json": DEMO_IMAGE,
}

#: Grant names a producer may ask for, per harness, unless the operator says otherwise.
DEFAULT_GRANTS: dict[str, tuple[str, ...]] = {
    "claude-code": ("ANTHROPIC_API_KEY", "CLAUDE_CODE_OAUTH_TOKEN"),
    "codex": ("OPENAI_API_KEY",),
    "gemini": ("GEMINI_API_KEY", "GOOGLE_API_KEY"),
    "opencode": ("OPENAI_API_KEY", "ANTHROPIC_API_KEY", "OPENCODE_API_KEY"),
    "pi": ("OPENAI_API_KEY", "ANTHROPIC_API_KEY", "PI_API_KEY"),
    "stdio-json": ("DEMO_TOKEN",),
}

MODEL_KEYS: frozenset[str] = frozenset(
    {
        "ANTHROPIC_API_KEY",
        "ANTHROPIC_AUTH_TOKEN",
        "CLAUDE_CODE_OAUTH_TOKEN",
        "OPENAI_API_KEY",
        "CODEX_API_KEY",
        "GEMINI_API_KEY",
        "GOOGLE_API_KEY",
        "OPENCODE_API_KEY",
        "PI_API_KEY",
    }
)
"""The variables the five CLIs read their model key from (docs/adapters.md, "The model
gateway"): granted, each becomes a stand-in."""


def model_keys(extra: Iterable[str] = ()) -> frozenset[str]:
    """The model keys: the five CLIs' own and the operator's (HARNESS_MODEL_KEYS)."""
    return MODEL_KEYS | frozenset(extra)
