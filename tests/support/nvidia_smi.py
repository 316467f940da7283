"""Real nvidia-smi outputs (``tests/data/nvidia-smi/``) behind the project's ``Smi`` interface.

``machine`` answers each query with the output captured on one real machine,
and fails (``""``, as ``run_nvidia_smi`` does) for a query nobody captured
there, so every fact a test reads went through the production parsers.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from repromatrix.host import nvidia_smi
from repromatrix.host.nvidia_smi import Smi
from support import paths

CAPTURES = paths.DATA / "nvidia-smi"


def captured(name: str) -> str:
    """A captured output as nvidia-smi printed it: the command line a capture starts with
    (a line beginning with ``#`` or ``$``) dropped."""
    lines = (CAPTURES / name).read_text(encoding="utf-8").splitlines(keepends=True)
    return "".join(lines[1:] if lines and lines[0][:1] in "#$" else lines)


def machine(answers: Mapping[tuple[str, ...], str]) -> Smi:
    """An nvidia-smi that gives, for each query, the captured file ``answers`` names."""

    def smi(args: Sequence[str]) -> str:
        name = answers.get(tuple(args))
        return captured(name) if name is not None else ""

    return smi


# The captured machines: the files that come from one and the same host.
H100 = {  # nvidia_gpu_exporter's H100 80GB HBM3 capture, driver 590.48.01
    nvidia_smi.QUERY_GPUS: "csv-query-gpu-h100-80gb-hbm3.txt",
    nvidia_smi.VERSION: "version-590.48.01-h100.txt",
}
H200_MIG = {  # its H200 capture with MIG enabled
    nvidia_smi.QUERY_GPUS: "csv-query-gpu-h200-mig.txt",
    nvidia_smi.LIST: "list-h200-mig.txt",
}
H100_MIG = {nvidia_smi.LIST: "list-h100-mig.txt"}  # its H100 capture with MIG enabled
A100_MIG = {  # 4x A100-SXM4-80GB, GPU 0 in MIG mode (telegraf#5812 and its XML fixture)
    nvidia_smi.LIST: "list-4x-a100-sxm4-80gb-mig-on-gpu0.txt",
    nvidia_smi.XML: "xml-a100-sxm4-80gb-mig.xml",
}
L40S = {nvidia_smi.QUERY_GPUS: "csv-query-gpu-2x-l40s-header.txt"}  # 2x L40S (akash#99)
TITAN_V_RTX_5880 = {  # triton-inference-server#8070
    nvidia_smi.QUERY_GPUS: "csv-query-gpu-compute-cap-2x-mixed.txt",
    nvidia_smi.LIST: "list-2x-mixed-titanv-rtx5880ada.txt",
}
MACHINES: Mapping[str, Mapping[tuple[str, ...], str]] = {
    "h100": H100,
    "h200-mig": H200_MIG,
    "h100-mig": H100_MIG,
    "a100-mig": A100_MIG,
    "l40s": L40S,
    "titan-v-rtx-5880": TITAN_V_RTX_5880,
}
TOPOLOGIES = sorted(path.name for path in CAPTURES.glob("topo-*.txt"))


def install_program(folder: Path, answers: Mapping[tuple[str, ...], str]) -> Path:
    """An ``nvidia-smi`` program in ``folder`` (put it first on PATH) that prints, for each
    query of ``answers``, the capture it names, and fails (exit 9) for any other: a stand-in
    runner for a ``repromatrix`` process, read through ``run_nvidia_smi`` and its parsers."""
    outputs = {"\0".join(args): captured(name) for args, name in answers.items()}
    program = folder / "nvidia-smi"
    folder.mkdir(parents=True, exist_ok=True)
    program.write_text(
        f"#!{sys.executable}\n"
        "import json, sys\n"
        f"OUTPUTS = json.loads({json.dumps(json.dumps(outputs))})\n"
        "text = OUTPUTS.get('\\0'.join(sys.argv[1:]))\n"
        "if text is None:\n"
        "    sys.exit(9)\n"
        "sys.stdout.write(text)\n",
        encoding="utf-8",
    )
    program.chmod(0o755)
    return program
