"""Round-trip edits and promotion policy (pure functions)."""

from __future__ import annotations

import pytest

from registry.edit import guess_indent, set_channel, set_signature
from registry.loader import load_manifest
from registry.policy import promotion_violations
from registry.schema import RegisteredModel, Signature
from registry.yamlsrc import parse_yaml

MODEL = """\
# yaml-language-server: $schema=../../.modelreg/schemas/model.schema.json
apiVersion: modelreg/v1   # pinned
kind: RegisteredModel
metadata:
    name: mlp
spec:
    owner: team@example.com  # who to page
    channels:
        production: '1.0.0'  # quoted on purpose
        canary:
            version: 1.1.0
            rollout: {percent: 10}
    promotion:
        order:
        - canary
        - production
"""


def model_of(text: str) -> RegisteredModel:
    manifest = load_manifest(parse_yaml(text.encode(), "m.yaml"), "RegisteredModel")
    assert isinstance(manifest, RegisteredModel)
    return manifest


def changed_lines(old: str, new: str) -> tuple[list[str], list[str]]:
    a, b = old.splitlines(), new.splitlines()
    return [x for x in a if x not in b], [x for x in b if x not in a]


def test_guess_indent() -> None:
    assert guess_indent(MODEL) == (4, 0)
    assert guess_indent("a:\n  b:\n    - x\n") == (2, 2)
    assert guess_indent("a: 1\n") == (2, 0)


def test_set_existing_shorthand_channel_keeps_everything_else() -> None:
    new = set_channel(MODEL, "m.yaml", "production", "1.1.0", None)
    assert changed_lines(MODEL, new) == (
        ["        production: '1.0.0'  # quoted on purpose"],
        ["        production: '1.1.0'  # quoted on purpose"],
    )
    assert model_of(new).spec.channels["production"].version == "1.1.0"


def test_full_rollout_removes_the_rollout_block() -> None:
    new = set_channel(MODEL, "m.yaml", "canary", "1.2.0", None)
    assert changed_lines(MODEL, new) == (
        ["            version: 1.1.0", "            rollout: {percent: 10}"],
        ["            version: 1.2.0"],
    )
    assert model_of(new).spec.channels["canary"].rollout is None


def test_percent_updates_or_adds_rollout() -> None:
    new = set_channel(MODEL, "m.yaml", "canary", "1.1.0", 25)
    assert changed_lines(MODEL, new) == (
        ["            rollout: {percent: 10}"],
        ["            rollout: {percent: 25}"],
    )
    added = set_channel(MODEL, "m.yaml", "beta", "1.0.0", 2.5)
    channel = model_of(added).spec.channels["beta"]
    assert channel.version == "1.0.0"
    assert channel.rollout is not None
    assert channel.rollout.percent == 2.5
    assert (
        "        beta:\n            version: 1.0.0\n            rollout: {percent: 2.5}\n" in added
    )


def test_channels_block_created_when_missing() -> None:
    text = (
        "apiVersion: modelreg/v1\nkind: RegisteredModel\nmetadata:\n  name: m\nspec:\n  owner: x\n"
    )
    new = set_channel(text, "m.yaml", "production", "2.0.0", None)
    assert new.endswith("spec:\n  owner: x\n  channels:\n    production: 2.0.0\n")


def test_set_signature_goes_before_channels() -> None:
    sig = Signature.model_validate(
        {
            "inputs": [{"name": "x", "dtype": "float32", "shape": ["batch", 3]}],
            "outputs": [{"name": "y", "dtype": "int64", "shape": ["batch"]}],
        }
    )
    new = set_signature(MODEL, "m.yaml", sig)
    assert model_of(new).spec.signature == sig
    lines = new.splitlines()
    assert lines.index("    signature:") < lines.index("    channels:")
    assert "          shape: [batch, 3]" in lines


@pytest.mark.parametrize(
    ("version", "channel", "serving", "expected"),
    [
        ("1.1.0", "dev", {}, []),
        ("1.1.0", "canary", {"dev": "1.1.0"}, []),
        ("1.1.0", "production", {"canary": "1.1.0"}, []),
        ("1.1.0", "production", {"production": "1.1.0"}, []),  # re-pin
        ("1.1.0", "production", {}, ["version 1.1.0 must be promoted to 'canary' before 'production' (promotion order: dev, canary, production)"]),
        ("1.1.0", "production", {"dev": "1.1.0"}, ["version 1.1.0 must be promoted to 'canary' before 'production' (promotion order: dev, canary, production)"]),
        ("1.1.0", "beta", {}, ["channel 'beta' is not in the promotion order of 'mlp' (dev, canary, production); to add a channel, list it in spec.promotion.order of the model"]),
        ("1.1.0", "prodution", {}, ["channel 'prodution' is not in the promotion order of 'mlp' (dev, canary, production); did you mean 'production'? To add a channel, list it in spec.promotion.order of the model"]),
        ("9.0.0", "dev", {}, ["version 9.0.0 is not declared for model 'mlp' (declared: 1.0.0, 1.1.0)"]),
    ],
)  # fmt: skip
def test_promotion_policy(
    version: str, channel: str, serving: dict[str, str], expected: list[str]
) -> None:
    model = RegisteredModel.model_validate(
        {
            "apiVersion": "modelreg/v1",
            "kind": "RegisteredModel",
            "metadata": {"name": "mlp"},
            "spec": {"channels": serving, "promotion": {"order": ["dev", "canary", "production"]}},
        }
    )
    assert promotion_violations(model, {"1.0.0", "1.1.0"}, version, channel) == expected


def test_no_order_means_any_channel() -> None:
    model = RegisteredModel.model_validate(
        {
            "apiVersion": "modelreg/v1",
            "kind": "RegisteredModel",
            "metadata": {"name": "m"},
            "spec": {},
        }
    )
    assert promotion_violations(model, {"1.0.0"}, "1.0.0", "anything") == []
