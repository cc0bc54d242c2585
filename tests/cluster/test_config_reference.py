"""docs/configuration.md is the reference made from the definitions (issue 13): every
setting of every section, with its default, unit and meaning."""

from __future__ import annotations

import dataclasses

import pytest

from store import config as config_module
from store.client.protocol import ClientSettings
from store.config_reference import MissingDocumentation, comment_docs, reference
from store.core.settings import DEFAULT_SETTINGS, DEFAULT_STREAM_SETTINGS
from tests.conftest import REPO


def test_the_reference_in_docs_is_the_one_the_definitions_make() -> None:
    shipped = (REPO / "docs" / "configuration.md").read_text()
    assert shipped == reference(), "run: meridian config-reference > docs/configuration.md"


@pytest.mark.parametrize(
    "instance",
    [DEFAULT_SETTINGS, DEFAULT_STREAM_SETTINGS, config_module.MERIDIAN_RPC_SETTINGS, ClientSettings()],
    ids=lambda i: type(i).__name__,
)
def test_every_setting_is_in_the_reference(instance: object) -> None:
    text = reference()
    for field in dataclasses.fields(instance):  # type: ignore[arg-type]
        assert f"| `{field.name}` |" in text, field.name


def test_every_structural_key_is_in_the_reference() -> None:
    text = reference()
    for section, keys in config_module.STRUCTURE.items():
        for key in keys:
            assert f"| `{key}` |" in text, (section, key)


def test_a_field_without_documentation_fails_the_reference(monkeypatch: pytest.MonkeyPatch) -> None:
    import store.config_reference as module

    real = comment_docs

    def forgetful(cls: type) -> dict[str, str]:
        docs = real(cls)
        docs.pop("batch_delay_ns", None)
        return docs

    monkeypatch.setattr(module, "comment_docs", forgetful)
    with pytest.raises(MissingDocumentation, match="batch_delay_ns"):
        module.reference()


def test_comments_above_a_group_of_fields_document_each_of_them() -> None:
    docs = comment_docs(type(DEFAULT_SETTINGS))
    assert docs["leader_timeout_ns"] == docs["cm_timeout_ns"]  # one comment, three fields
    assert "UTF-8" in docs["key_bytes_max"]
