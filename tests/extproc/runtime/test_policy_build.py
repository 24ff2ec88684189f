"""A reload's build in the builder process: what it installs is the policy the file holds,
entry for entry and in order, the unchanged parts the running policy's own objects; a
broken policy is refused with the loader's reason. Through the holder, in a running
sidecar: tests/e2e/extproc/runtime/test_policy_holder.py."""

from __future__ import annotations

import asyncio
import hashlib
import os
from pathlib import Path

import pytest
import yaml

from extproc.runtime import policy_build
from extproc.runtime.policy_build import Built, build_elsewhere, text_digest
from extproc.runtime.policy_holder import PolicyHolder
from extproc.service.metrics import SidecarMetrics
from policy._reader import PolicyError
from policy.loader import policy_from_text
from policy.schema import Policy
from tooling.benchmarks.tenants import many_tenants_policy, operator_edits


@pytest.fixture(scope="module")
def tenants_policy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # More keys than one slice, so that the keys come in several.
    return many_tenants_policy(tmp_path_factory.mktemp("build"), tenants=60, keys=1200)


def _build(path: Path, running_text: str, tell_text: bool = True) -> tuple[Policy, Built]:
    running = policy_from_text(running_text, str(path))
    digest = text_digest(str(path), running_text)
    built = asyncio.run(
        build_elsewhere(str(path), running, digest, running_text if tell_text else None)
    )
    return running, built


def _same(built: Policy, expected: Policy) -> None:
    assert built == expected
    assert list(built.keys) == list(expected.keys)  # the file's order, not only its entries
    assert list(built.tenants.listed) == list(expected.tenants.listed)


def test_an_edit_comes_back_as_the_file_reads_and_keeps_what_did_not_change(
    tenants_policy: Path, tmp_path: Path
) -> None:
    path = tmp_path / "policy.yaml"
    before = tenants_policy.read_text()
    edited = operator_edits(tenants_policy, 1)[0]  # a key added, one tenant's limit changed
    path.write_text(edited)
    running, built = _build(path, before)
    assert built.builder_pid != os.getpid()
    expected = policy_from_text(edited, str(path))
    _same(built.policy, expected)
    assert built.digest == text_digest(str(path), edited)
    changed = {h for h, key in expected.keys.items() if running.keys.get(h) != key}
    assert 1 < len(changed) <= 21  # the new key and the changed tenant's twenty
    for digest, key in built.policy.keys.items():
        # The unchanged are the running policy's own objects; the changed came new.
        assert (key is running.keys.get(digest)) == (digest not in changed)
    assert built.rebuilt == len(changed) + 1  # and the one tenant
    assert built.policy.pools is running.pools


@pytest.mark.parametrize(
    "edit",
    ["remove a key", "reorder the keys", "change every key's tier", "no change"],
)
def test_other_edits_come_back_as_the_file_reads(
    tenants_policy: Path, tmp_path: Path, edit: str
) -> None:
    raw = yaml.safe_load(tenants_policy.read_text())
    if edit == "remove a key":
        del raw["keys"][7]
    elif edit == "reorder the keys":
        raw["keys"].reverse()
    elif edit == "change every key's tier":
        raw["tiers"] = {"standard": {"tokens_per_minute": 123}}
    path = tmp_path / "policy.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    running, built = _build(path, tenants_policy.read_text())
    _same(built.policy, policy_from_text(path.read_text(), str(path)))
    if edit == "no change":
        assert built.rebuilt == 0 and built.policy.keys is running.keys


def test_a_builder_that_does_not_know_the_running_policy_sends_it_all(
    tenants_policy: Path, tmp_path: Path
) -> None:
    path = tmp_path / "policy.yaml"
    edited = operator_edits(tenants_policy, 1)[0]
    path.write_text(edited)
    # Not told the running text, and never built it (its digest names nothing it keeps).
    running, built = _build(path, tenants_policy.read_text() + "\n# unseen\n", tell_text=False)
    _same(built.policy, policy_from_text(edited, str(path)))
    assert built.reused == 0
    assert not any(key is running.keys.get(h) for h, key in built.policy.keys.items())


def test_a_broken_or_missing_policy_is_refused_with_the_loaders_reason(tmp_path: Path) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text("keys: [{key: sk-x, tenant: x, colour: red}]\n")
    with pytest.raises(PolicyError, match=r"keys\[0\]\.colour: unknown field"):
        _build(path, "keys: [{key: sk-a, tenant: a}]\n")
    path.unlink()
    with pytest.raises(PolicyError, match="No such file"):
        _build(path, "keys: [{key: sk-a, tenant: a}]\n")


def test_the_holder_installs_each_reload_and_keeps_the_old_policy_on_a_broken_one(
    tenants_policy: Path, tmp_path: Path
) -> None:
    """Through PolicyHolder, as SIGHUP and the admin API reload: each edit in turn, a broken
    file refused (the running policy stays), then an edit on top of what runs; and a
    builder killed between reloads is started again."""
    path = tmp_path / "policy.yaml"
    path.write_text(tenants_policy.read_text())
    metrics = SidecarMetrics()
    holder = PolicyHolder(path, metrics)
    edits = operator_edits(tenants_policy, 3)

    async def scenario() -> None:
        path.write_text(edits[0])
        assert await holder.reload_error() is None
        _same(holder(), policy_from_text(edits[0], str(path)))
        installed = holder()
        path.write_text(edits[1].replace("tenants:", "tenants:\n  colour: red", 1))
        reason = await holder.reload_error()
        assert reason is not None and "tenants.colour: unknown field" in reason
        assert holder() is installed
        policy_build._BUILDER.stop()  # died between reloads: the next one starts another
        for text in edits[1:]:
            path.write_text(text)
            assert await holder.reload_error() is None
            _same(holder(), policy_from_text(text, str(path)))

    asyncio.run(scenario())
    value = metrics.registry.get_sample_value
    assert value("slogate_policy_reloads_total", {"result": "ok"}) == 3
    assert value("slogate_policy_reloads_total", {"result": "rejected"}) == 1
    digest = hashlib.sha256(b"sk-reload-2").hexdigest()
    assert holder().keys[digest].tenant == holder().keys[next(iter(holder().keys))].tenant
